"""Admission throttles: category mixing for claims, and in-flight caps for chat calls.

``InFlight`` bounds what chat calls may hold at once: calls per credential (``max_inflight_per_key``)
and generation rows server-wide (``max_batch_rows`` running + ``max_queued_rows`` waiting). A call
takes its slot before any work (rendering included) and gives it back when its generation ends,
finished, failed or cancelled; beyond a cap the answer is 429 + ``Retry-After``, never a wait.

``CategoryThrottle`` keeps the groups started per category at the configured ratios. Multi-task
"cocktails" tag each claim with a ``category``. With ``category_ratios`` set, the server answers a
claim that would start a new group of an over-represented category with 429 + ``retry_after``, so
clients move on to other tasks and the training batches follow the mix. The rule is a deficit
counter: a category may start a group while it is less than one group ahead of its share of all
groups started so far. Members of an already started group are never throttled (the group must
complete), and categories absent from the ratios are not throttled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from swarm.server.errors import BadRequest, RetryLater

# Seconds a refused chat call is told to wait: a slot frees when one generation ends.
KEY_RETRY_S = 1.0
QUEUE_RETRY_S = 2.0


class CategoryThrottle:
    def __init__(self, ratios: dict[str, float]) -> None:
        self.reset(ratios)

    def reset(self, ratios: dict[str, float]) -> None:
        total = sum(ratios.values())
        self._shares = {c: r / total for c, r in ratios.items()} if total > 0 else {}
        self._started: Counter[str] = Counter()

    @property
    def active(self) -> bool:
        return bool(self._shares)

    def allows(self, category: str | None) -> bool:
        """Whether a new group of ``category`` may start now."""
        if category is None or category not in self._shares:
            return True
        total_after = sum(self._started[c] for c in self._shares) + 1
        excess = self._started[category] + 1 - self._shares[category] * total_after
        return excess < 1.0 - 1e-9

    def started(self, category: str | None) -> None:
        if category is not None and category in self._shares:
            self._started[category] += 1

    def counts(self) -> dict[str, int]:
        return dict(self._started)


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
