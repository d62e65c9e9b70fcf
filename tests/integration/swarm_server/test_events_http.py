"""``GET /api/v1/events`` over a real uvicorn on loopback with an httpx streaming client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from support import free_port, wait_for

from swarm.protocol import Event
from swarm.server.auth import KeyRing
from swarm.server.errors import install_error_handlers
from swarm.server.events import EventBus, events_router

TOKEN = "control-token-for-tests"


@dataclass
class Served:
    bus: EventBus
    url: str
    keys: KeyRing


def _serve(bus: EventBus, port: int, ping_s: float) -> Iterator[Served]:
    keys = KeyRing(TOKEN, b"s" * 32)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(events_router(bus, keys.control, ping_s=ping_s))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 10, what="uvicorn to start", interval=0.01)
    if not server.started:
        raise RuntimeError("uvicorn did not start: its thread ended")
    try:
        yield Served(bus, f"http://127.0.0.1:{port}/api/v1/events", keys)
    finally:
        bus.close()  # ends open streams so uvicorn can shut down
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def served() -> Iterator[Served]:
    yield from _serve(EventBus(capacity=1000), free_port(), ping_s=0.2)


@pytest.fixture
def served_small_queue() -> Iterator[Served]:
    yield from _serve(EventBus(capacity=1000, queue_size=5), free_port(), ping_s=30)


def _auth(**extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", **extra}


def _sse(response: httpx.Response, comments: list[str] | None = None) -> Iterator[dict[str, str]]:
    """Parse an SSE byte stream into {id, event, data} dicts (comments go to ``comments``)."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if fields:
                yield fields
            fields = {}
        elif line.startswith(":"):
            if comments is not None:
                comments.append(line)
        else:
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value


def test_live_stream_in_order_with_sse_fields(served: Served) -> None:
    with httpx.Client(timeout=10) as client, client.stream("GET", served.url, headers=_auth()) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        wait_for(lambda: served.bus.subscribers >= 1, 5, what="the stream to subscribe", interval=0.005)
        publisher = threading.Thread(target=lambda: [served.bus.publish("step.finished", step=i) for i in range(30)])
        publisher.start()
        got = []
        for item in _sse(response):
            got.append(item)
            if len(got) == 30:
                break
        publisher.join()
    assert [int(x["id"]) for x in got] == list(range(1, 31))
    assert {x["event"] for x in got} == {"step.finished"}
    events = [Event.model_validate_json(x["data"]) for x in got]
    assert [e.data["step"] for e in events] == list(range(30))
    assert [e.id for e in events] == list(range(1, 31))


def test_resume_with_last_event_id_header_and_query(served: Served) -> None:
    for i in range(10):
        served.bus.publish("episode.finished", n=i)
    with httpx.Client(timeout=10) as client:
        with client.stream("GET", served.url, headers=_auth(**{"Last-Event-ID": "6"}),
                           params={"last_event_id": 1}) as response:  # the header wins
            stream = _sse(response)
            replayed = [int(next(stream)["id"]) for _ in range(4)]
            served.bus.publish("episode.finished", n=10)
            live = int(next(stream)["id"])
        assert replayed == [7, 8, 9, 10] and live == 11
        params = {"last_event_id": 9, "max_events": 2}
        with client.stream("GET", served.url, headers=_auth(), params=params) as response:
            assert [int(x["id"]) for x in _sse(response)] == [10, 11]  # then the server ends the stream


def test_keepalive_pings_and_timeout(served: Served) -> None:
    comments: list[str] = []
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        with client.stream("GET", served.url, headers=_auth(), params={"timeout_s": 0.7}) as response:
            assert list(_sse(response, comments)) == []
    assert time.monotonic() - started < 5
    assert any("ping" in c for c in comments)


def test_overflowing_reader_is_told_to_reconnect_and_loses_nothing(served_small_queue: Served) -> None:
    bus = served_small_queue.bus
    blob = "x" * 64_000  # large events fill the socket buffers, so the server-side reader falls behind
    total = 400
    with httpx.Client(timeout=20) as client:
        with client.stream("GET", served_small_queue.url, headers=_auth()) as response:
            wait_for(lambda: bus.subscribers >= 1, 5, what="the stream to subscribe", interval=0.005)
            for i in range(total):
                bus.publish("big", i=i, blob=blob)  # never blocks, however slow the reader
            first = list(_sse(response))  # the server ends this stream after the notice
        notice = first[-1]
        assert notice["event"] == "error"
        body = Event.model_validate_json(notice["data"])
        assert body.data["code"] == "subscriber_overflow" and body.data["reconnect"] is True
        delivered = [int(x["id"]) for x in first[:-1]]
        assert delivered == list(range(1, len(delivered) + 1)) and len(delivered) < total
        assert int(notice["id"]) == delivered[-1]
        with client.stream("GET", served_small_queue.url, headers=_auth(**{"Last-Event-ID": notice["id"]}),
                           params={"max_events": total - delivered[-1]}) as response:
            resumed = [int(x["id"]) for x in _sse(response)]
    assert resumed == list(range(delivered[-1] + 1, total + 1))


def test_control_token_required_and_bad_ids_refused(served: Served) -> None:
    with httpx.Client(timeout=10) as client:
        missing = client.get(served.url)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
        episode_key = served.keys.episode_key("ep-1")
        forbidden = client.get(served.url, headers={"Authorization": f"Bearer {episode_key}"})
        assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
        for headers, params in [({"Last-Event-ID": "abc"}, {}), ({}, {"last_event_id": -1}),
                                ({}, {"timeout_s": 0}), ({}, {"max_events": 0})]:
            bad = client.get(served.url, headers=_auth(**headers), params=params)
            assert bad.status_code in (400, 422), (headers, params, bad.status_code)
            assert "error" in bad.json()
    assert served.bus.subscribers == 0
