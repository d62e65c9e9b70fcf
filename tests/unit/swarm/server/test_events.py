"""The event bus: ids, thread-safe publishing, replay, overflow, restart continuity."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from swarm.protocol import Event
from swarm.server.durability.store import EpisodeStore
from swarm.server.events import EventBus


async def _take(stream, n: int, timeout: float = 5.0) -> list[Event]:
    out: list[Event] = []
    async with asyncio.timeout(timeout):
        async for event in stream:
            out.append(event)
            if len(out) == n:
                break
    return out


async def _until_subscribed(bus: EventBus, n: int = 1) -> None:
    async with asyncio.timeout(5):
        while bus.subscribers < n:
            await asyncio.sleep(0.005)


def test_publishers_on_many_threads_reach_a_subscriber_in_id_order() -> None:
    bus = EventBus(queue_size=10_000)

    async def main() -> list[Event]:
        stream = bus.subscribe()
        reader = asyncio.create_task(_take(stream, 2000))
        await _until_subscribed(bus)

        def worker(k: int) -> None:
            for i in range(500):
                bus.publish("step.finished", worker=k, i=i)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        bus.publish("loop.event")  # and one from the loop thread itself
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        got = await reader
        await stream.aclose()
        return got

    got = asyncio.run(main())
    ids = [e.id for e in got]
    assert ids == list(range(1, 2001))
    assert bus.last_id == 2001
    for k in range(4):  # each worker's own events keep their order
        assert [e.data["i"] for e in got if e.data.get("worker") == k] == list(range(len(
            [e for e in got if e.data.get("worker") == k])))
    assert bus.subscribers == 0  # closing the stream unsubscribed it


def test_resume_replays_then_streams_live() -> None:
    bus = EventBus(capacity=100)
    for i in range(10):
        bus.publish("episode.finished", n=i)

    async def main() -> list[Event]:
        stream = bus.subscribe(last_event_id=6)
        first = await _take(stream, 4)
        bus.publish("episode.finished", n=10)
        first += await _take(stream, 1)
        await stream.aclose()
        return first

    assert [e.id for e in asyncio.run(main())] == [7, 8, 9, 10, 11]
    assert [e.id for e in bus.replay(8)] == [9, 10, 11]


def test_resume_past_the_ring_reports_lost_events() -> None:
    bus = EventBus(capacity=5)
    for i in range(20):
        bus.publish("x", i=i)

    async def main() -> list[Event]:
        stream = bus.subscribe(last_event_id=3)
        got = await _take(stream, 6)
        await stream.aclose()
        return got

    got = asyncio.run(main())
    assert got[0].type == "error" and got[0].data["code"] == "events_lost"
    assert got[0].data["first_available"] == 16 and got[0].id == 3
    assert [e.id for e in got[1:]] == [16, 17, 18, 19, 20]


def test_slow_subscriber_overflows_without_blocking_publishers() -> None:
    bus = EventBus(capacity=1000, queue_size=5)

    async def main() -> tuple[list[Event], list[Event]]:
        slow = bus.subscribe(last_event_id=0)
        fast = bus.subscribe(last_event_id=0)
        # Start both (registration happens on first iteration), then publish 50 while neither reads.
        bus.publish("first")
        assert [e.id for e in await _take(slow, 1)] == [1]
        assert [e.id for e in await _take(fast, 1)] == [1]
        for i in range(50):
            bus.publish("burst", i=i)
        rest = [e async for e in slow]  # ends by itself after the overflow notice
        resumed = await _take(bus.subscribe(last_event_id=rest[-1].id), 51 - rest[-1].id)
        await fast.aclose()
        return rest, resumed

    rest, resumed = asyncio.run(main())
    assert [e.id for e in rest[:-1]] == [2, 3, 4, 5, 6]
    notice = rest[-1]
    assert notice.type == "error" and notice.data["code"] == "subscriber_overflow" and notice.data["reconnect"]
    assert notice.id == notice.data["last_event_id"] == 6
    assert [e.id for e in resumed] == list(range(7, 52))  # nothing missed after reconnecting
    assert bus.subscribers == 0


def test_close_ends_subscriptions() -> None:
    bus = EventBus()

    async def main() -> list[Event]:
        stream = bus.subscribe()
        task = asyncio.create_task(_take(stream, 10))
        await _until_subscribed(bus)
        bus.publish("a")
        await asyncio.sleep(0.01)
        threading.Thread(target=bus.close).start()  # from another thread, as a shutdown hook might
        return await task

    assert [e.type for e in asyncio.run(main())] == ["a"]


def test_bad_events_are_refused_and_use_no_id() -> None:
    bus = EventBus()
    with pytest.raises(ValueError, match="plain JSON"):
        bus.publish("x", value=object())
    with pytest.raises(ValueError, match="plain JSON"):
        bus.publish("x", value=float("nan"))
    with pytest.raises(ValueError):
        bus.publish("")
    assert bus.publish("ok").id == 1
    assert bus.publish("config.changed", type="x", values={}).data == {"type": "x", "values": {}}
    with pytest.raises(ValueError):
        EventBus(capacity=0)


def test_ids_and_replay_survive_a_restart_through_the_store(tmp_path: Path) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        bus = EventBus(journal=store)
        for i in range(7):
            bus.publish("episode.finished", i=i)
    # "Restart": a new process would open the store and seed the bus from it.
    with EpisodeStore(tmp_path / "buf.db") as store:
        bus = EventBus(start_id=store.last_event_id(), history=store.recent_events(), journal=store)
        assert bus.publish("server.started").id == 8

        async def main() -> list[Event]:
            stream = bus.subscribe(last_event_id=5)
            got = await _take(stream, 3)
            await stream.aclose()
            return got

        got = asyncio.run(main())
        assert [(e.id, e.type) for e in got] == [(6, "episode.finished"), (7, "episode.finished"),
                                                 (8, "server.started")]
        assert got[0].data == {"i": 5}
        assert store.last_event_id() == 8


def test_a_failing_journal_does_not_stop_events() -> None:
    class Broken:
        def append_event(self, event: Event) -> None:
            raise OSError("disk gone")

    bus = EventBus(journal=Broken())
    assert [bus.publish("a").id, bus.publish("b").id] == [1, 2]
