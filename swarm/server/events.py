"""The server's event stream: a thread-safe bus with replay, and ``GET /api/v1/events`` as SSE.

Why: the researcher and ``swarm events`` watch a server live (episode.*, step.*, weights.*,
config.*, error) and must not miss events across a dropped connection. Every event gets a
monotonically increasing id; the bus keeps the last ``capacity`` events in a ring so a client that
reconnects with ``Last-Event-ID`` gets exactly what it missed, then the live stream. Ids continue
across server restarts when the server passes ``start_id`` (and optionally ``history``) from its
store.

Publishers are never blocked by readers: ``publish`` may be called from the event-loop thread or the
device worker thread; it only appends to each subscriber's bounded queue and wakes its loop. A
subscriber that falls ``queue_size`` events behind receives one ``error`` event
(``code="subscriber_overflow"``) and its stream ends; it reconnects with its last id and is replayed
from the ring. If even the ring no longer holds what it missed, the replay starts with an ``error``
event (``code="events_lost"``) saying which ids are gone.

Each reader costs a queue and a connection, so the route caps them (``max_event_subscribers``): a
reader beyond the cap gets 429 + ``Retry-After`` before any stream starts. ``EventBus.open``
registers a reader at once (so the count is exact) and the response unregisters it when the stream
ends, however it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from swarm.protocol import API_PREFIX, Event
from swarm.server.durability.diskspace import EventSink
from swarm.server.errors import RetryLater
from swarm.server.view import LiveConfig

log = logging.getLogger(__name__)

__all__ = ["SSE_EVENT_SCHEMA", "EventBus", "Subscription", "TooManySubscribers", "events_router"]

SUBSCRIBER_RETRY_S = 5.0

# One Server-Sent Event as a stream reader sees it (OpenAPI describes event streams per event).
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}},
}


@dataclass(eq=False)
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    thread: int
    wake: asyncio.Event
    queue: deque[Event] = field(default_factory=deque)
    overflowed: bool = False
    wake_scheduled: bool = False

    def set_wake(self) -> None:  # runs on the subscriber's loop
        self.wake_scheduled = False
        self.wake.set()


class TooManySubscribers(RuntimeError):
    """``EventBus.open`` found as many readers as its ``limit`` allows."""


@dataclass(eq=False)
class Subscription:
    """A registered reader: iterate ``events``; ``close()`` unregisters it (idempotent)."""

    events: AsyncGenerator[Event, None]
    close: Callable[[], None]


class EventBus:
    """Publish events with increasing ids; subscribe with replay from a ring buffer."""

    def __init__(
        self,
        capacity: int = 10_000,
        *,
        start_id: int = 0,
        queue_size: int = 1_000,
        history: Iterable[Event] = (),
        journal: EventSink | None = None,
    ) -> None:
        """``start_id``: the last id already used (the next event gets ``start_id + 1``).
        ``history``: earlier events (e.g. from the store) to seed the replay ring.
        ``journal``: persists each event, in id order (``journal.append_event``: the store, or
        ``QuietEventLog`` around it); its errors are logged, never raised into the publisher."""
        if capacity < 1 or queue_size < 1 or start_id < 0:
            raise ValueError("capacity and queue_size must be >= 1 and start_id >= 0")
        self._lock = threading.Lock()
        self._ring: deque[Event] = deque(maxlen=capacity)
        for event in history:
            if event.id <= start_id:
                self._ring.append(event)
        self._last_id = start_id
        self._queue_size = queue_size
        self._subscribers: set[_Subscriber] = set()
        self._journal = journal
        self._closed = False

    @property
    def last_id(self) -> int:
        return self._last_id

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def on_event(self, type_: str, data: dict[str, Any]) -> None:
        """A server core listener (``ServerCore.add_listener``): publish what the core emits."""
        self.publish(type_, **data)

    def publish(self, type: str, /, **data: Any) -> Event:  # the SSE field is called type
        """Record one event and hand it to every subscriber; never blocks on readers."""
        if not type:
            raise ValueError("event type must be non-empty")
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"event {type!r} data must be plain JSON: {exc}") from None
        with self._lock:
            self._last_id += 1
            event = Event(id=self._last_id, type=type, time=time.time(), data=data)
            self._ring.append(event)
            if self._journal is not None:
                try:
                    self._journal.append_event(event)
                except Exception:  # persisting is best effort; the live stream must go on
                    log.exception("recording event %d failed", event.id)
            for sub in list(self._subscribers):
                if sub.overflowed:
                    continue
                if len(sub.queue) >= self._queue_size:
                    sub.overflowed = True
                else:
                    sub.queue.append(event)
                self._wake(sub)
        return event

    def _wake(self, sub: _Subscriber) -> None:
        """Wake a subscriber's loop; called with the lock held."""
        if threading.get_ident() == sub.thread:
            sub.wake.set()
        elif not sub.wake_scheduled:
            # Flag first: the callback may run on the other loop before call_soon_threadsafe returns,
            # and it must find the flag set so it can clear it (else every later wake is skipped).
            sub.wake_scheduled = True
            try:
                sub.loop.call_soon_threadsafe(sub.set_wake)
            except RuntimeError:  # its loop is closed: the subscriber is gone
                self._subscribers.discard(sub)

    def replay(self, after: int) -> list[Event]:
        """Events in the ring with id > ``after``."""
        with self._lock:
            return [e for e in self._ring if e.id > after]

    def close(self) -> None:
        """End every subscription (server shutdown); later subscriptions end at once."""
        with self._lock:
            self._closed = True
            for sub in list(self._subscribers):
                self._wake(sub)

    async def subscribe(self, last_event_id: int | None = None) -> AsyncIterator[Event]:
        """Events after ``last_event_id`` from the ring, then live events, until the bus closes or
        this subscriber overflows (then a final ``error`` event says to reconnect)."""
        subscription = self.open(last_event_id)
        try:
            async for event in subscription.events:
                yield event
        finally:
            subscription.close()

    def open(self, last_event_id: int | None = None, *, limit: int | None = None) -> Subscription:
        """Register a reader now (``subscribe`` without the wait): ``TooManySubscribers`` when
        ``limit`` readers are registered already. The caller must ``close()`` it when done."""
        sub = _Subscriber(loop=asyncio.get_running_loop(), thread=threading.get_ident(), wake=asyncio.Event())
        with self._lock:
            if limit is not None and not self._closed and len(self._subscribers) >= limit:
                raise TooManySubscribers(f"{len(self._subscribers)} event streams are open, the most this server "
                                         "serves at once (max_event_subscribers); retry later")
            replay: list[Event] = []
            lost: tuple[int, int] | None = None
            if last_event_id is not None and last_event_id < self._last_id:
                replay = [e for e in self._ring if e.id > last_event_id]
                first_kept = replay[0].id if replay else self._last_id + 1
                if first_kept > last_event_id + 1:
                    lost = (last_event_id + 1, first_kept - 1)
            closed = self._closed
            if not closed:
                self._subscribers.add(sub)

        def close() -> None:
            with self._lock:
                self._subscribers.discard(sub)

        return Subscription(self._stream(sub, replay, lost, closed, last_event_id or 0), close)

    async def _stream(self, sub: _Subscriber, replay: list[Event], lost: tuple[int, int] | None, closed: bool,
                      delivered: int) -> AsyncGenerator[Event, None]:
        if lost is not None:
            yield self._notice(delivered, "events_lost",
                               f"events {lost[0]}..{lost[1]} are no longer kept; continuing from {lost[1] + 1}",
                               first_available=lost[1] + 1)
        for event in replay:
            delivered = event.id
            yield event
        while not closed:
            with self._lock:
                batch = list(sub.queue)
                sub.queue.clear()
                overflowed, closed = sub.overflowed, self._closed
                if not batch and not overflowed and not closed:
                    sub.wake.clear()  # under the lock: a later publish sets it again
            for event in batch:
                delivered = event.id
                yield event
            if overflowed:
                yield self._notice(delivered, "subscriber_overflow",
                                   f"this reader fell more than {self._queue_size} events behind; "
                                   "reconnect with Last-Event-ID to resume", reconnect=True)
                return
            if not batch and not closed:
                await sub.wake.wait()

    @staticmethod
    def _notice(last_id: int, code: str, message: str, **extra: Any) -> Event:
        """A per-subscriber ``error`` event. It carries the id of the last event this reader got,
        so an SSE client's Last-Event-ID stays where it should resume."""
        return Event(id=last_id, type="error", time=time.time(),
                     data={"code": code, "message": message, "last_event_id": last_id, **extra})


def events_router(bus: EventBus, require_control: Callable[..., Any], *, ping_s: float = 15.0,
                  live: LiveConfig | None = None) -> APIRouter:
    """``GET /api/v1/events``: the bus as Server-Sent Events (``id`` = event id, ``event`` = type,
    ``data`` = the ``protocol.Event`` as JSON). ``require_control`` is a FastAPI dependency that
    refuses callers without the control token; ``live.config.max_event_subscribers`` is the live
    reader cap (None, or no ``live``: no cap)."""
    router = APIRouter()

    @router.get(
        f"{API_PREFIX}/events",
        dependencies=[Depends(require_control)],
        response_class=EventSourceResponse,
        responses={200: {"description": "Server-Sent Events; each `data` is a JSON `Event`",
                         "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}}}},
        summary="Live server events (SSE) with Last-Event-ID resume",
    )
    async def events(
        last_event_id: int | None = Query(None, ge=0, description="resume after this id"),
        last_event_id_header: int | None = Header(None, alias="Last-Event-ID", ge=0,
                                                  description="set by SSE clients on reconnect; wins over the query"),
        timeout_s: float | None = Query(None, gt=0, le=86_400, description="end the stream after this many seconds"),
        max_events: int | None = Query(None, ge=1, description="end the stream after this many events"),
    ) -> EventSourceResponse:
        start = last_event_id_header if last_event_id_header is not None else last_event_id
        try:
            subscription = bus.open(start, limit=live.config.max_event_subscribers if live is not None else None)
        except TooManySubscribers as exc:
            raise RetryLater(str(exc), retry_after=SUBSCRIBER_RETRY_S) from None
        return _EventStream(subscription, _sse(subscription.events, timeout_s, max_events), ping=ping_s)

    return router


class _EventStream(EventSourceResponse):
    """The SSE response that unregisters its reader however the stream ends (even if it never starts)."""

    def __init__(self, subscription: Subscription, content: AsyncIterator[ServerSentEvent], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._subscription.close()


async def _sse(stream: AsyncGenerator[Event, None], timeout_s: float | None, max_events: int | None
               ) -> AsyncIterator[ServerSentEvent]:
    deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
    sent = 0
    try:
        while max_events is None or sent < max_events:
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return
            try:
                event = await asyncio.wait_for(anext(stream), remaining)
            except (StopAsyncIteration, TimeoutError):
                return
            sent += 1
            yield ServerSentEvent(data=event.model_dump_json(), event=event.type, id=str(event.id))
    finally:
        await stream.aclose()
