"""Null studies with five looks, decided by the study's own code: the paired interval (``stats``), the
look's boundary (``looks``) and the verdict verdicts. With the registered boundary the false-positive rate
stays at or below 5%; testing each look at a plain 95% does not."""

from __future__ import annotations

import random

from researcher.evidence import looks, sizing, stats
from researcher.findings import verdicts
from researcher.findings.records import LookPlan, SequentialDesign

STUDIES = 10_000
PILOT, BATCH, LOOKS = 3, 3, 5
SD, MIN_EFFECT = 0.1, 0.02  # spread of a seed's paired difference; the minimum effect hardly ever saves a call


def _schedule() -> list[LookPlan]:
    design = sizing.register(LOOKS, PILOT).model_copy(update={"max_seeds": PILOT + BATCH * (LOOKS - 1)})
    schedule = [sizing.pilot_look(design)]
    room = sizing.Room(time_left_s=1e9, run_s=1.0, parallel=2, runs_left=10_000, arms=2)
    while (nxt := sizing.next_look(design, schedule[-1], room)) is not None:
        schedule.append(nxt)
    return schedule


def _false_positive_rate(boundary: bool) -> float:
    design = SequentialDesign(looks=LOOKS, pilot_seeds=PILOT)
    schedule = _schedule()
    assert [lk.seeds for lk in schedule] == [3, 6, 9, 12, 15] and schedule[-1].fraction == 1.0
    at_look = [looks.current(design, schedule[:k + 1]) for k in range(len(schedule))]
    rng = random.Random(7)
    wrong = 0
    for _ in range(STUDIES):
        diffs = {seed: rng.gauss(0.0, SD) for seed in range(schedule[-1].seeds)}  # no true difference
        for k, planned in enumerate(schedule):
            seen = {s: d for s, d in diffs.items() if s < planned.seeds}
            estimate = stats.compare_arms(seen, dict.fromkeys(seen, 0.0))  # arm A − arm B per seed
            look = at_look[k]
            assert look is not None
            half_width = look.half_width(estimate) if boundary else estimate.half_width
            verdict = verdicts.classify(estimate.mean, half_width, MIN_EFFECT)
            if verdicts.settled(verdict):
                wrong += verdicts.resolved(verdict)
                break
    return wrong / STUDIES


def test_registered_looks_keep_the_false_positive_rate_at_five_percent() -> None:
    assert SequentialDesign().target == 0.05
    assert _false_positive_rate(boundary=True) <= 0.05


def test_a_plain_95_percent_interval_at_every_look_is_wrong_more_often() -> None:
    assert _false_positive_rate(boundary=False) > 0.05
