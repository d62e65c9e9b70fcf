"""Live capacity figures: how busy the learner is, how fast each client delivers episodes, how long
its episodes take, and what was finished, dropped or refused over the last minute.

These are the inputs of ECHO-2's provisioning rule (``swarm plan``) and of admission
(``swarm.server.flow.admission``): ``perf/learner_busy`` is the fraction of wall time the trainer spent
updating rather than waiting for a batch, between the end of one step and the end of the next;
``perf/rollout_eps_per_client`` is the episodes finished per second per client over a recent window
(at least ``MIN_WINDOW_S``, so a learner that steps every few hundred milliseconds still sees a
stable rate). ``step_interval`` is the mean interval over the last few steps (the step rate: a
burst of back-to-back steps is not the pace) and ``episode_s`` the median of a client's last few
episodes (from the first chat call to the finish), so one odd step or episode does not swing admission.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from swarm.protocol import RecentCounts

MIN_WINDOW_S = 10.0
RECENT_S = 60.0  # the window of ``recent`` (what ``swarm status`` judges the drop rate by)
_KEEP_S = 600.0  # finishes older than this can no longer fall in a window
_PACE = 8  # steps, and episodes per client, whose median is the current pace
_MIN_PACE = 3  # fewer than this many and the pace is unknown
_CLIENTS = 256  # clients whose episode durations are kept (the least recently finished go first)

_Event = TypeVar("_Event", bound=tuple[Any, ...])


class CapacityMeter:
    """Fed by the core (each finish, drop and refusal) and the step loop (each step); one event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._finishes: deque[tuple[float, str]] = deque()
        self._drops: deque[tuple[float, int, bool]] = deque()  # (when, episodes, stale)
        self._refusals: deque[tuple[float]] = deque()
        self._last_step_end = clock()
        self._intervals: deque[float] = deque(maxlen=_PACE)
        self._durations: OrderedDict[str, deque[float]] = OrderedDict()

    def episode_finished(self, client_id: str, duration_s: float | None = None) -> None:
        """A training episode finished, ``duration_s`` after its first chat call (None: it made none)."""
        now = self._clock()
        self._finishes.append((now, client_id))
        _trim(self._finishes, now - _KEEP_S)
        if duration_s is not None and duration_s >= 0:
            self._durations.setdefault(client_id, deque(maxlen=_PACE)).append(duration_s)
            self._durations.move_to_end(client_id)
            while len(self._durations) > _CLIENTS:
                self._durations.popitem(last=False)

    def dropped(self, episodes: int, *, stale: bool) -> None:
        now = self._clock()
        self._drops.append((now, episodes, stale))
        _trim(self._drops, now - RECENT_S)

    def refused(self) -> None:
        now = self._clock()
        self._refusals.append((now,))
        _trim(self._refusals, now - RECENT_S)

    def step_finished(self, update_s: float) -> dict[str, float]:
        """The figures for a step whose update took ``update_s``; starts the next interval."""
        now = self._clock()
        interval = max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        self._intervals.append(interval)
        window = max(interval, MIN_WINDOW_S)
        recent = [client for at, client in self._finishes if at >= now - window]
        clients = len(set(recent))
        return {"perf/learner_busy": min(update_s / interval, 1.0),
                "perf/rollout_eps_per_client": len(recent) / window / clients if clients else 0.0}

    # ------------------------------------------------------------------ the pace (admission's inputs)

    def step_interval(self) -> float | None:
        """Seconds between step commits: the mean of the last few; None before a few steps."""
        return statistics.fmean(self._intervals) if len(self._intervals) >= _MIN_PACE else None

    def since_step(self) -> float:
        return self._clock() - self._last_step_end

    def episode_s(self, client_id: str) -> float | None:
        """The median duration (first chat call to finish) of the client's last few episodes; None if too few."""
        durations = self._durations.get(client_id)
        if durations is None or len(durations) < _MIN_PACE:
            return None
        return statistics.median(durations)

    def recent(self) -> RecentCounts:
        """Finished, dropped and refused over the last ``RECENT_S`` seconds."""
        since = self._clock() - RECENT_S
        drops = [(n, stale) for at, n, stale in self._drops if at >= since]
        return RecentCounts(window_s=RECENT_S, finished=sum(1 for at, _ in self._finishes if at >= since),
                            dropped=sum(n for n, _ in drops), dropped_stale=sum(n for n, stale in drops if stale),
                            refused_stale=sum(1 for (at,) in self._refusals if at >= since))


def _trim(events: deque[_Event], before: float) -> None:
    """Forget the events (oldest first, each a tuple that starts with its time) from before ``before``."""
    while events and events[0][0] < before:
        events.popleft()
