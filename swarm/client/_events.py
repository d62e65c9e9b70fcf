"""Reading the server's Server-Sent Events stream (``GET /api/v1/events``) as ``protocol.Event``s.

The stream is parsed line by line per the SSE format (``id:``, ``event:``, ``data:``, comments for
keep-alives). A dropped connection is resumed with ``Last-Event-ID`` so no event is missed or
repeated, within the client's retry window.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import httpx
from pydantic import ValidationError

from swarm.client._errors import SwarmHTTPError, SwarmUnavailable
from swarm.client._transport import Transport
from swarm.protocol import API_PREFIX, Event

log = logging.getLogger(__name__)


def iter_events(transport: Transport, *, last_event_id: int | None, reconnect: bool) -> Iterator[Event]:
    """Yield events forever (until the server ends the stream and ``reconnect`` is off)."""
    last = last_event_id
    down_since: float | None = None
    while True:
        headers = {"Accept": "text/event-stream"}
        if last is not None:
            headers["Last-Event-ID"] = str(last)
        try:
            with transport.stream(f"{API_PREFIX}/events", headers=headers) as response:
                down_since = None
                for event in _parse(response.iter_lines()):
                    last = event.id
                    yield event
        except SwarmHTTPError as exc:
            if exc.status < 500:
                raise
            problem: Exception = exc
        except httpx.TransportError as exc:
            problem = exc
        else:
            if not reconnect:
                return
            problem = ConnectionError("stream ended")
        if not reconnect:
            raise SwarmUnavailable(f"event stream failed: {problem}") from problem
        now = time.monotonic()
        down_since = down_since or now
        if now - down_since > transport.retry_for_s:
            raise SwarmUnavailable(f"event stream down for {transport.retry_for_s:.0f} s: {problem}") from problem
        log.info("event stream interrupted (%s); resuming after id %s", problem, last)
        time.sleep(0.5)


def _parse(lines: Iterator[str]) -> Iterator[Event]:
    sse_id: str | None = None
    name = "message"
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                event = _to_event(sse_id, name, "\n".join(data))
                if event is not None:
                    yield event
            sse_id, name, data = None, "message", []
            continue
        if line.startswith(":"):
            continue  # keep-alive comment
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            sse_id = value
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)


def _to_event(sse_id: str | None, name: str, data: str) -> Event | None:
    """The data line is the ``Event`` itself; a bare payload is wrapped using the SSE id and name."""
    try:
        return Event.model_validate_json(data)
    except ValidationError:
        pass
    try:
        payload = json.loads(data)
        return Event(id=int(sse_id or 0), type=name, time=time.time(),
                     data=payload if isinstance(payload, dict) else {"value": payload})
    except (ValueError, ValidationError):
        log.warning("skipping malformed event %r: %r", name, data[:200])
        return None
