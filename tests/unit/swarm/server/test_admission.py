"""Admission's rules (``swarm.server.flow.admission``): the capacity bound keeps every admitted group within
``max_staleness``, the duration rule refuses what would be stale before it ends, refusals are 429s
with a bounded ``retry_after``, and nothing is refused with admission off or past ``max_steps``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from swarm.config import ServerConfig
from swarm.server.errors import RetryLater
from swarm.server.flow.admission import FULL, LONG, Admission, Backlog, outlasts, over_capacity, retry_after
from swarm.server.flow.capacity import CapacityMeter


def test_capacity_bound_counts_training_waiting_and_in_flight() -> None:
    batch = 4  # groups a step trains
    assert not over_capacity(Backlog(training=0, waiting=4, in_flight=3, batch=batch), 1, max_staleness=1)
    assert over_capacity(Backlog(training=0, waiting=4, in_flight=4, batch=batch), 1, max_staleness=1)
    assert over_capacity(Backlog(training=4, waiting=4, in_flight=0, batch=batch), 1, max_staleness=1)
    assert over_capacity(Backlog(training=4, waiting=0, in_flight=0, batch=batch), 1, max_staleness=0)
    assert not over_capacity(Backlog(training=0, waiting=0, in_flight=0, batch=batch), 99, max_staleness=0)  # alone


def _worst_staleness(max_staleness: int, batch: int, *, count_training: bool, sampled_after_update: bool,
                     steps: int = 30) -> int:
    """A greedy client against FIFO steps (groups finish in the order they start): the most versions
    any trained group lagged. Admission fills the backlog while a step trains and after it commits;
    what is admitted during a step samples the old version, or (one device thread for sampling and
    training) the step's new one."""
    version, worst = 0, 0
    waiting: deque[int] = deque()  # the version each waiting group was sampled by

    def fill(training: int, sampled_by: int) -> None:
        while not over_capacity(Backlog(training if count_training else 0, len(waiting), 0, batch), 1, max_staleness):
            waiting.append(sampled_by)

    fill(0, version)
    for _ in range(steps):
        taken = [waiting.popleft() for _ in range(batch)]
        fill(len(taken), version + 1 if sampled_after_update else version)
        worst = max(worst, *(version - sampled for sampled in taken))
        version += 1  # the step commits: its batch leaves the backlog
        fill(0, version)
    return worst


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
@pytest.mark.parametrize("batch", [1, 4])
def test_nothing_admitted_is_older_than_max_staleness_when_trained(max_staleness: int, batch: int) -> None:
    # A generator beside the trainer: the running step's batch counts until the step commits;
    # otherwise the backlog refills during the step and the last of it trains one version too late.
    assert _worst_staleness(max_staleness, batch, count_training=True, sampled_after_update=False) <= max_staleness
    assert _worst_staleness(max_staleness, batch, count_training=False,
                            sampled_after_update=False) == max_staleness + 1
    # Sampling that waits out the update (one device thread) may refill during the step: the engine
    # leaves the batch out there, and the learner has the next batch sampled before it needs it.
    assert _worst_staleness(max_staleness, batch, count_training=False, sampled_after_update=True) <= max_staleness


def test_duration_rule_and_retry_after() -> None:
    assert outlasts(2.1, 1.0, max_staleness=1) and not outlasts(1.9, 1.0, max_staleness=1)
    assert not outlasts(None, 1.0, max_staleness=0) and not outlasts(5.0, None, max_staleness=0)
    assert retry_after(None, 0.0) == 1.0  # no step yet
    assert retry_after(1.0, 0.3) == pytest.approx(0.7)  # the rest of the step interval
    assert retry_after(1.0, 3.0) == pytest.approx(0.25)  # overdue: a quarter of one
    assert retry_after(100.0, 0.0) == 5.0 and retry_after(0.01, 0.0) == 0.1  # bounded


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _View:
    config: ServerConfig
    config_version: int = 0
    policy_version: int = 0
    step: int = 0
    paused: bool = False
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def clock(self) -> float:
        return 0.0

    def emit(self, type_: str, **data: Any) -> None:
        self.events.append((type_, data))


@dataclass
class _Training:
    """The training side as admission sees it: a fixed backlog, and whether steps still train."""

    held: Backlog
    active: bool = True

    def backlog(self) -> Backlog:
        return self.held

    def past_max_steps(self) -> bool:
        return not self.active


def _admission(backlog: Backlog, active: bool = True, **config: Any) -> tuple[Admission, CapacityMeter, _Clock, _View]:
    clock = _Clock()
    meter = CapacityMeter(clock)
    view = _View(ServerConfig().patched(config))
    return Admission(view, training=_Training(backlog, active), capacity=meter), meter, clock, view


def _steps(meter: CapacityMeter, clock: _Clock, interval: float, count: int = 4) -> None:
    for _ in range(count):
        clock.now += interval
        meter.step_finished(interval / 2)


def test_a_full_backlog_refuses_new_groups_with_429_and_counts_them() -> None:
    full = Backlog(training=4, waiting=4, in_flight=0, batch=4)
    admission, meter, clock, _ = _admission(full, max_staleness=1)
    _steps(meter, clock, 1.0)
    clock.now += 0.4
    with pytest.raises(RetryLater) as refused:
        admission.claim("c", group_size=8)
    assert refused.value.status == 429 and refused.value.retry_after == pytest.approx(0.6)
    assert refused.value.detail == {"reason": FULL, "step": 0} and admission.refused == {FULL: 1}
    assert meter.recent().refused_stale == 1
    # Room at a higher max_staleness; never refused with admission off or past max_steps.
    for roomy in (_admission(full, max_staleness=2)[0], _admission(full, admission=False)[0],
                  _admission(full, active=False)[0]):
        roomy.claim("c", group_size=8)
        assert not roomy.refused


def test_episodes_mode_counts_the_new_groups_members() -> None:
    backlog = Backlog(training=0, waiting=20, in_flight=8, batch=16)  # episodes, batch_groups=2 x group_size=8
    admission, *_ = _admission(backlog, batch_mode="episodes", batch_groups=2, group_size=8, max_staleness=1)
    admission.claim("c", group_size=4)  # 28 + 4 = 32 = 2 batches
    with pytest.raises(RetryLater):
        admission.claim("c", group_size=5)


def test_a_client_whose_episodes_outlast_the_bound_is_refused_until_steps_slow() -> None:
    admission, meter, clock, _ = _admission(Backlog(0, 0, 1, batch=4), max_staleness=1)
    _steps(meter, clock, 1.0)
    for _ in range(4):
        meter.episode_finished("slow", duration_s=2.5)  # 2.5 steps of 1 s: stale before it ends
        meter.episode_finished("fast", duration_s=0.5)
    with pytest.raises(RetryLater) as refused:
        admission.first_call("slow")
    assert refused.value.detail == {"reason": LONG, "step": 0}
    with pytest.raises(RetryLater):
        admission.claim("slow", group_size=8)
    admission.claim("fast", group_size=8)
    admission.first_call("fast")
    clock.now += 1.5  # the learner has not stepped for 1.5 s: 2.5 s is less than two such steps now
    admission.first_call("slow")
    assert admission.refused == {LONG: 2}
