"""Live capacity figures: how busy the learner is and how fast each client delivers episodes.

These are the inputs of ECHO-2's provisioning rule (``swarm plan``): ``perf/learner_busy`` is the
fraction of wall time the trainer spent updating rather than waiting for a batch, between the end
of one step and the end of the next; ``perf/rollout_eps_per_client`` is the episodes finished per
second per client over a recent window (at least ``MIN_WINDOW_S``, so a learner that steps every
few hundred milliseconds still sees a stable rate).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MIN_WINDOW_S = 10.0
_KEEP_S = 600.0  # finishes older than this can no longer fall in a window


class CapacityMeter:
    """Fed by the engine (each finish) and the step loop (each step); thread-safe enough for one loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._finishes: deque[tuple[float, str]] = deque()
        self._last_step_end = clock()

    def episode_finished(self, client_id: str) -> None:
        now = self._clock()
        self._finishes.append((now, client_id))
        while self._finishes and self._finishes[0][0] < now - _KEEP_S:
            self._finishes.popleft()

    def step_finished(self, update_s: float) -> dict[str, float]:
        """The figures for a step whose update took ``update_s``; starts the next interval."""
        now = self._clock()
        interval = max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        window = max(interval, MIN_WINDOW_S)
        recent = [client for at, client in self._finishes if at >= now - window]
        clients = len(set(recent))
        return {"perf/learner_busy": min(update_s / interval, 1.0),
                "perf/rollout_eps_per_client": len(recent) / window / clients if clients else 0.0}
