"""The relay chain on loopback: real uvicorn servers (``Depot`` + ``Inbox`` + ``relay_router``), the
server's side as a node without an inbox, a real HTTP proxy that corrupts chunks in flight, and a node
process killed mid-push. Run as a script, this file is that node process::

    python tests/integration/pool/test_relay.py --port P [--rate BYTES_PER_S] [--sources URL,URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response

from swarm.weights.bucket import TokenBucket
from swarm.weights.relay import Depot, Inbox, disseminate, fetch, relay_router
from swarm.weights.shards import Manifest, ShardError, decode, encode

TOKEN = "worker-token"
TESTS = Path(__file__).resolve().parents[2]
# The repository first, so that `swarm` is always the package, whatever folders the path holds.
_NODE_PATH = os.pathsep.join([str(TESTS.parent), str(TESTS)])


def _authorize(request: Request) -> None:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise HTTPException(401, "missing or invalid worker token")


def _node_app(depot: Depot, inbox: Inbox | None) -> FastAPI:
    app = FastAPI()
    app.include_router(relay_router(depot, inbox, _authorize))
    return app


class _Served:
    """An ASGI app served by uvicorn on a loopback port, in a thread with its own event loop."""

    def __init__(self, app: FastAPI) -> None:
        from support import free_port, wait_for

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 20, what=f"a relay node on {self.url} to start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class _Node(_Served):
    """A worker's relay side; ``received`` records every ``on_version`` call."""

    def __init__(self, *, sources: tuple[str, ...] = (), rate: float | None = None, inbox: bool = True) -> None:
        self.depot = Depot()
        self.received: list[tuple[int, list[bytes]]] = []
        self.unusable: set[int] = set()  # versions on_version fails on (as a delta without its base would)
        self.sources = list(sources)
        self.inbox = Inbox(self.depot, on_version=self._on_version, token=TOKEN, rate_bytes_per_s=rate,
                           sources=lambda: self.sources) if inbox else None
        super().__init__(_node_app(self.depot, self.inbox))

    async def _on_version(self, manifest: Manifest, chunks: list[bytes]) -> None:
        if manifest.version in self.unusable:
            raise ShardError(f"version {manifest.version} cannot be applied here")
        self.received.append((manifest.version, chunks))


class _CorruptingProxy(_Served):
    """A real HTTP hop in front of ``target`` that flips one bit of chunk ``index``'s body (a PUT
    pushed through it, or a GET answered through it) the first ``times`` times."""

    def __init__(self, target: str, index: int, times: int = 1) -> None:
        self.left = times
        self.flipped = 0
        self.chunk_gets = 0  # chunk GETs answered through it
        app = FastAPI()
        app.add_api_route("/{path:path}", self._forward, methods=["GET", "POST", "PUT"])
        self._target, self._suffix = target, f"/chunks/{index}"
        super().__init__(app)

    def _maybe_flip(self, body: bytes, path: str) -> bytes:
        if not path.endswith(self._suffix) or self.left <= 0 or not body:
            return body
        self.left -= 1
        self.flipped += 1
        return bytes([body[0] ^ 0x01]) + body[1:]

    async def _forward(self, path: str, request: Request) -> Response:
        body = await request.body()
        if request.method == "PUT":
            body = self._maybe_flip(body, path)
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.request(request.method, f"{self._target}/{path}", content=body, headers=headers)
        content = answer.content
        self.chunk_gets += request.method == "GET" and "/chunks/" in path
        if request.method == "GET" and answer.is_success:
            content = self._maybe_flip(content, path)
        return Response(content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))


class _NodeProcess:
    """This file run as a node process (so the test can SIGKILL it)."""

    def __init__(self, *, sources: tuple[str, ...], rate: float | None, log: Path) -> None:
        from support import ManagedProcess, free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [sys.executable, __file__, "--port", str(self.port), "--sources", ",".join(sources)]
        if rate is not None:
            args += ["--rate", str(rate)]
        self.node = ManagedProcess(log).launch(args, env={"PYTHONPATH": _NODE_PATH})

    def wait_ready(self) -> None:
        from support import wait_for

        wait_for(lambda: _status(f"{self.url}/pool/v1/versions") == 200, 60, interval=0.1,
                 what=f"the node process on {self.url}", proc=self.node.process, log=self.node.log_path)

    def holds_chunk(self, version: int, index: int) -> bool:
        return _status(f"{self.url}/pool/v1/versions/{version}/chunks/{index}") == 200

    def kill(self) -> None:
        self.node.kill()


def _status(url: str, token: str | None = TOKEN) -> int:
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(url, headers=headers, timeout=2).status_code
    except httpx.TransportError:
        return 0


def _payload(version: int, megabytes: float, chunk_bytes: int) -> tuple[dict[str, torch.Tensor], Manifest, list[bytes]]:
    weights = {"w": torch.randn(int(megabytes * (1 << 20)) // 4, generator=torch.Generator().manual_seed(version))}
    manifest, chunks = encode(version, weights, chunk_bytes=chunk_bytes)
    return weights, manifest, chunks


@pytest.fixture
def started() -> Iterator[list]:
    """Whatever a test starts (servers, proxies, processes), stopped at the end."""
    things: list = []
    yield things
    for thing in reversed(things):
        (thing.kill if isinstance(thing, _NodeProcess) else thing.stop)()


def _start(started: list, thing):
    started.append(thing)
    return thing


def test_a_chain_of_three_gets_each_version_once_for_one_upload(started: list) -> None:
    origin = _start(started, _Node(inbox=False))
    a, b, c = (_start(started, _Node(sources=(origin.url,))) for _ in range(3))
    weights, manifest, chunks = _payload(1, 4, chunk_bytes=256 << 10)
    origin.depot.put(manifest, chunks)
    rate = 2 << 20  # every sender shaped to 2 MB/s: S/B = 2 s
    report = asyncio.run(disseminate(origin.depot, 1, [a.url, b.url, c.url], token=TOKEN, rate_bytes_per_s=rate))
    assert report.reached == [a.url, b.url, c.url] and report.failed == []
    assert report.bytes_sent == manifest.total_bytes  # one copy from the origin, whatever the chain
    # Pipelined: store-and-forward would take 3 S/B = 6 s; the chain takes S/B plus a few chunks.
    assert report.seconds < 4.0, report
    for node in (a, b, c):
        assert [v for v, _ in node.received] == [1]
        assert node.received[0][1] == chunks
        assert node.depot.versions() == [1]
    assert torch.equal(decode(manifest, c.received[0][1])["w"], weights["w"])

    # A delta over it goes the same way; a repeated push sends nothing and calls no one twice.
    new = {"w": weights["w"].clone()}
    new["w"][::1000] += 1.0
    delta, delta_chunks = encode(2, new, base=(1, weights), chunk_bytes=64 << 10)
    origin.depot.put(delta, delta_chunks)
    report = asyncio.run(disseminate(origin.depot, 2, [a.url, b.url, c.url], token=TOKEN))
    assert report.reached == [a.url, b.url, c.url]
    again = asyncio.run(disseminate(origin.depot, 2, [a.url, b.url, c.url], token=TOKEN))
    assert again.reached == [a.url, b.url, c.url] and again.bytes_sent == 0
    for node in (a, b, c):
        assert [v for v, _ in node.received] == [1, 2]
    got = decode(delta, c.received[1][1], base=(1, decode(manifest, c.received[0][1])))
    assert torch.equal(got["w"], new["w"])


def test_a_wrong_token_is_refused_and_nothing_is_stored(started: list) -> None:
    origin = _start(started, _Node(inbox=False))
    a = _start(started, _Node())
    _, manifest, chunks = _payload(1, 0.5, chunk_bytes=64 << 10)
    origin.depot.put(manifest, chunks)
    report = asyncio.run(disseminate(origin.depot, 1, [a.url], token="not-the-token"))
    assert report.reached == [] and report.failed == [a.url]
    assert a.depot.versions() == [] and a.received == []
    assert _status(f"{a.url}/pool/v1/versions", token="not-the-token") == 401
    assert _status(f"{origin.url}/pool/v1/versions/1/chunks/0", token=None) == 401
    with pytest.raises(httpx.HTTPStatusError) as refused:
        asyncio.run(fetch(origin.url, 1, token="not-the-token"))
    assert refused.value.response.status_code == 401


def test_catch_up_fetches_verify_and_an_unknown_version_is_404(started: list) -> None:
    origin = _start(started, _Node(inbox=False))
    _, manifest, chunks = _payload(7, 1, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    assert asyncio.run(fetch(origin.url, 7, token=TOKEN)) == (manifest, chunks)
    assert _status(f"{origin.url}/pool/v1/versions/8/manifest") == 404
    assert _status(f"{origin.url}/pool/v1/versions/7/chunks/99") == 404
    with pytest.raises(httpx.HTTPStatusError) as missing:
        asyncio.run(fetch(origin.url, 8, token=TOKEN))
    assert missing.value.response.status_code == 404
    once = _start(started, _CorruptingProxy(origin.url, index=3, times=1))
    assert asyncio.run(fetch(once.url, 7, token=TOKEN)) == (manifest, chunks)  # refetched once
    assert once.flipped == 1
    always = _start(started, _CorruptingProxy(origin.url, index=3, times=100))
    with pytest.raises(ShardError, match="chunk 3"):
        asyncio.run(fetch(always.url, 7, token=TOKEN))


def test_catch_up_takes_chunks_from_peers_and_the_rest_from_the_source(started: list) -> None:
    from support import free_port

    origin = _start(started, _Node(inbox=False))
    _, manifest, chunks = _payload(7, 1, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    server = _start(started, _CorruptingProxy(origin.url, index=-1))  # counts the chunks the source serves
    peer = _start(started, _Node(inbox=False))
    peer.depot.put(manifest, chunks)
    assert asyncio.run(fetch(server.url, 7, token=TOKEN, peers=[peer.url])) == (manifest, chunks)
    assert server.chunk_gets == 0  # the manifest from the source, every chunk from the peer
    liar = _start(started, _CorruptingProxy(peer.url, index=3, times=100))  # serves chunk 3 wrong
    assert asyncio.run(fetch(server.url, 7, token=TOKEN, peers=[liar.url])) == (manifest, chunks)
    assert liar.flipped == 1 and server.chunk_gets == 1  # checked against the source's manifest
    empty = _start(started, _Node(inbox=False))  # does not hold the version (or another encoding of it)
    server.chunk_gets = 0
    assert asyncio.run(fetch(server.url, 7, token=TOKEN, peers=[peer.url, empty.url])) == (manifest, chunks)
    assert server.chunk_gets == len(chunks) // 2  # chunks 1, 3, 5, ...: the empty peer's share
    gone = f"http://127.0.0.1:{free_port()}"  # a peer that left
    assert asyncio.run(fetch(server.url, 7, token=TOKEN, peers=[gone])) == (manifest, chunks)


def test_a_chunk_corrupted_in_flight_is_refetched_from_a_source(started: list) -> None:
    origin = _start(started, _Node(inbox=False))
    a = _start(started, _Node(sources=(origin.url,)))
    b = _start(started, _Node())
    c = _start(started, _Node())
    proxy = _start(started, _CorruptingProxy(b.url, index=2))  # a -> proxy -> b flips chunk 2
    b.sources = [a.url, origin.url]  # predecessor first, then the server
    c.sources = [b.url, origin.url]
    _, manifest, chunks = _payload(1, 2, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    report = asyncio.run(disseminate(origin.depot, 1, [a.url, proxy.url, c.url], token=TOKEN))
    assert report.reached == [a.url, proxy.url, c.url] and report.failed == []
    assert proxy.flipped == 1 and b.inbox is not None and b.inbox.refetched == 1
    for node in (a, b, c):
        assert len(node.received) == 1 and node.received[0][1] == chunks


def test_a_member_that_is_down_is_skipped(started: list) -> None:
    from support import free_port

    origin = _start(started, _Node(inbox=False))
    a, c = _start(started, _Node()), _start(started, _Node())
    down = f"http://127.0.0.1:{free_port()}"
    _, manifest, chunks = _payload(1, 1, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    report = asyncio.run(disseminate(origin.depot, 1, [a.url, down, c.url], token=TOKEN, timeout_s=30))
    assert report.reached == [a.url, c.url] and report.failed == [down]
    assert c.received[0][1] == chunks


def test_a_member_killed_mid_push_does_not_stall_the_rest(started: list, tmp_path: Path) -> None:
    from support import wait_for

    rate = 2 << 20  # 3 MB at 2 MB/s a hop: the push takes about 1.5 s, time enough to kill b in it
    origin = _start(started, _Node(inbox=False))
    a = _start(started, _Node(sources=(origin.url,), rate=rate))
    b = _start(started, _NodeProcess(sources=(a.url, origin.url), rate=rate, log=tmp_path / "b.log"))
    c = _start(started, _Node(rate=rate))
    b.wait_ready()
    c.sources = [b.url, origin.url]
    _, manifest, chunks = _payload(1, 3, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    reports = []
    push = threading.Thread(target=lambda: reports.append(asyncio.run(
        disseminate(origin.depot, 1, [a.url, b.url, c.url], token=TOKEN, rate_bytes_per_s=rate, timeout_s=60))))
    push.start()
    wait_for(lambda: b.holds_chunk(1, 4), 30, interval=0.02, what="b to hold chunk 4 of version 1")
    b.kill()
    started_waiting = time.monotonic()
    push.join(60)
    assert reports, "disseminate did not return"
    report = reports[0]
    assert report.reached == [a.url, c.url] and report.failed == [b.url]
    assert time.monotonic() - started_waiting < 20  # no stall until the 60 s deadline
    assert len(c.received) == 1 and c.received[0][1] == chunks


def test_a_member_that_cannot_apply_a_version_relays_it_and_takes_another_encoding(started: list) -> None:
    origin = _start(started, _Node(inbox=False))
    a, b, c = (_start(started, _Node()) for _ in range(3))
    b.unusable.add(1)
    weights, manifest, chunks = _payload(1, 1, chunk_bytes=128 << 10)
    origin.depot.put(manifest, chunks)
    report = asyncio.run(disseminate(origin.depot, 1, [a.url, b.url, c.url], token=TOKEN))
    assert report.reached == [a.url, c.url] and report.failed == [b.url]
    assert b.received == [] and c.received[0][1] == chunks
    # Another encoding of version 1 replaces b's unusable one; a, which applied version 1, refuses it.
    b.unusable.clear()
    other, other_chunks = encode(1, weights, chunk_bytes=256 << 10)
    origin.depot.put(other, other_chunks)
    report = asyncio.run(disseminate(origin.depot, 1, [b.url, a.url], token=TOKEN))
    assert report.reached == [b.url] and report.failed == [a.url]
    assert b.received == [(1, other_chunks)] and len(a.received) == 1


def test_the_bucket_holds_its_rate_and_the_depot_its_size() -> None:
    async def send(bucket: TokenBucket, total: int, piece: int) -> float:
        began = time.monotonic()
        for _ in range(total // piece):
            await bucket.take(piece)
        return time.monotonic() - began

    assert asyncio.run(send(TokenBucket(None), 1 << 30, 1 << 20)) < 0.5
    seconds = asyncio.run(send(TokenBucket(4 << 20, burst_bytes=64 << 10), 2 << 20, 256 << 10))
    # 2 MB at 4 MB/s, less the first burst: ~0.48 s. The bucket holds the rate (the lower bound); the upper
    # one only says it does not throttle far below it (a loaded machine oversleeps its waits a little).
    assert 0.4 < seconds < 1.2
    depot = Depot(keep=2)
    for version in range(5):
        _, manifest, chunks = _payload(version, 0.01, chunk_bytes=1024)
        depot.put(manifest, chunks)
    assert depot.versions() == [3, 4] and depot.get(2) is None
    with pytest.raises(ValueError):
        TokenBucket(0)


def _serve_node(port: int, rate: float | None, sources: list[str]) -> None:
    depot = Depot()

    async def on_version(manifest: Manifest, chunks: list[bytes]) -> None:
        print(f"received version {manifest.version}", flush=True)

    inbox = Inbox(depot, on_version=on_version, token=TOKEN, rate_bytes_per_s=rate, sources=lambda: sources)
    uvicorn.run(_node_app(depot, inbox), host="127.0.0.1", port=port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one relay node process (for the kill test)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--sources", default="")
    args = parser.parse_args()
    _serve_node(args.port, args.rate, [s for s in args.sources.split(",") if s])
