"""Caps on chat calls running at once: calls per credential (``max_inflight_per_key``) and generation
rows server-wide (``max_batch_rows`` running + ``max_queued_rows`` waiting).

A call takes its slot before any work (rendering included) and gives it back when its generation ends,
finished, failed or cancelled; beyond a cap the answer is 429 + ``Retry-After``, never a wait. (The
task mix is ``category_mix``'s; whether work can still train is ``admission``'s.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from swarm.server.errors import BadRequest, RetryLater

# Seconds a refused chat call is told to wait: a slot frees when one generation ends.
KEY_RETRY_S = 1.0
QUEUE_RETRY_S = 2.0


class InFlight:
    """Chat calls running per credential and generation rows running or queued; event-loop only."""

    def __init__(self) -> None:
        self._per_key: Counter[str] = Counter()
        self.rows = 0

    def calls(self, key: str) -> int:
        return self._per_key[key]

    def enter(self, key: str, rows: int, *, per_key: int, max_rows: int) -> Callable[[], None]:
        """Take a slot for one call of ``rows`` rows; returns its (idempotent) release."""
        if rows > max_rows:
            raise BadRequest(f"n={rows} choices exceed the {max_rows} generation rows this server runs or "
                             "queues at once (max_batch_rows + max_queued_rows): ask for fewer")
        if self._per_key[key] >= per_key:
            raise RetryLater(f"this credential already has {per_key} chat calls running (max_inflight_per_key); "
                             "retry when one has returned", retry_after=KEY_RETRY_S)
        if self.rows + rows > max_rows:
            raise RetryLater(f"the generation queue is full ({self.rows} rows running or waiting, "
                             f"max_batch_rows + max_queued_rows = {max_rows}); retry shortly",
                             retry_after=QUEUE_RETRY_S)
        self._per_key[key] += 1
        self.rows += rows
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.rows -= rows
            self._per_key[key] -= 1
            if not self._per_key[key]:
                del self._per_key[key]

        return release
