"""ECHO-2's provisioning rule as `swarm plan` applies it (the live end-to-end check is in test_plan_live.py)."""

from __future__ import annotations

import math

import pytest

from swarm.plan import HEADROOM, Figures, NotEnoughData, advise, measure, required_eps
from swarm.protocol import StepMetrics


def _figures(**overrides: float) -> Figures:
    base = dict(learner_busy=0.2, train_s=0.4, broadcast_s=0.1, episodes_per_step=8.0, eps_per_client=2.0,
                clients=1, concurrency=1.0, steps=5)
    return Figures(**{**base, **overrides})  # type: ignore[arg-type]


def test_async_rule_matches_the_formula_and_more_staleness_needs_less() -> None:
    f = _figures()
    # κ = 1: 8 / (0.4/0.9 − 0.1) episodes/s; κ = 4: 32 / (4·0.4/0.9 − 0.1)
    assert required_eps(f, mode="async", staleness=1, target_busy=0.9) == pytest.approx(8 / (0.4 / 0.9 - 0.1))
    assert required_eps(f, mode="async", staleness=4, target_busy=0.9) == pytest.approx(32 / (1.6 / 0.9 - 0.1))
    assert required_eps(f, mode="async", staleness=4, target_busy=0.9) < required_eps(
        f, mode="async", staleness=1, target_busy=0.9)


def test_advice_scales_clients_and_concurrency_to_the_requirement() -> None:
    advice = advise(_figures(), mode="async", staleness=1, target_busy=0.9)
    assert not advice.enough
    need = advice.required_eps
    assert need is not None and need >= 8 / (0.4 / 0.9 - 0.1)
    # one client at concurrency 1 today: both answers provision the requirement with headroom
    assert advice.clients_needed == advice.concurrency_needed == math.ceil(need * HEADROOM / 2.0)


def test_sync_target_beyond_reach_says_so_instead_of_a_number() -> None:
    advice = advise(_figures(broadcast_s=0.5), mode="sync", staleness=0, target_busy=0.9)
    assert advice.required_eps is None and advice.clients_needed is None
    assert "async" in advice.reason


def test_bad_targets_and_too_few_steps_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="target-busy"):
        advise(_figures(), mode="async", staleness=1, target_busy=1.5)
    one = [StepMetrics(step=1, policy_version=1, time=0.0, metrics={"perf/step_s": 0.1})]
    with pytest.raises(NotEnoughData, match="at least 2"):
        measure(one, clients=1, in_flight=1)
