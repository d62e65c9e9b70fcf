"""The task mix: claims of each category start groups at the configured ratios (``category_ratios``).

Multi-task "cocktails" tag each claim with a ``category``. With ``category_ratios`` set, the server
answers a claim that would start a new group of an over-represented category with 429 +
``retry_after``, so clients move on to other tasks and the training batches follow the mix. The rule is
a deficit counter: a category may start a group while it is less than one group ahead of its share of
all groups started so far. Members of an already started group are never throttled (the group must
complete), and categories absent from the ratios are not throttled. (Whether work may start at all,
for staleness, is ``admission``'s; how many chat calls may run at once is ``inflight``'s.)
"""

from __future__ import annotations

from collections import Counter


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
