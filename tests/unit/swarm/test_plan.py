"""ECHO-2's provisioning rule as `swarm plan` applies it (the live end-to-end check is in test_plan_live.py)."""

from __future__ import annotations

import math

import pytest

from swarm.plan import (
    HEADROOM,
    Figures,
    NotEnoughData,
    WorkerFigure,
    advise,
    advise_pool,
    describe_pool,
    drop_fix,
    measure,
    required_eps,
)
from swarm.protocol import EpisodeCounts, RecentCounts, Status, StepMetrics


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


def _workers(*rates: tuple[str, str, float]) -> list[WorkerFigure]:
    return [WorkerFigure(id=wid, engine=engine, state="ready", tokens_per_s=rate) for wid, engine, rate in rates]


def test_pool_advice_keeps_the_fastest_workers_and_names_the_idle_cost() -> None:
    # needed = required_eps · tokens/episode · HEADROOM, all in tokens/s
    advice = advise(_figures(tokens_per_episode=50.0), mode="async", staleness=1, target_busy=0.9)
    assert advice.required_eps is not None
    needed = advice.required_eps * 50.0 * HEADROOM
    fast, slow = needed * 0.7, needed * 0.1
    workers = _workers(("a", "vllm", fast), ("b", "torch", slow), ("c", "vllm", fast), ("d", "torch", slow))
    workers.append(WorkerFigure(id="e", engine="torch", state="syncing", tokens_per_s=fast))  # not ready: no say
    pool = advise_pool(advice, workers)
    assert pool.required_tokens_per_s == pytest.approx(needed)
    assert pool.keep == ["a", "c"] and sorted(pool.deactivate) == ["b", "d"] and pool.add == 0
    assert pool.pool_tokens_per_s == pytest.approx(2 * fast + 2 * slow)


def test_pool_advice_adds_workers_of_the_fastest_kind_when_the_pool_falls_short() -> None:
    advice = advise(_figures(tokens_per_episode=50.0), mode="async", staleness=1, target_busy=0.9)
    needed = advice.required_eps * 50.0 * HEADROOM  # type: ignore[operator]
    pool = advise_pool(advice, _workers(("a", "torch", needed * 0.1), ("b", "vllm", needed * 0.3),
                                        ("u", "torch", 0.0)))
    assert pool.keep == ["b", "a"] and pool.deactivate == [] and pool.unmeasured == ["u"]
    assert pool.add_engine == "vllm" and pool.add == math.ceil(0.6 / 0.3 - 1e-9)
    assert any("add 2" in line for line in describe_pool(pool, disseminate_s=0.2))


def test_pool_advice_without_token_figures_says_so() -> None:
    advice = advise(_figures(), mode="async", staleness=1, target_busy=0.9)  # tokens_per_episode unknown
    pool = advise_pool(advice, _workers(("a", "torch", 10.0)))
    assert pool.required_tokens_per_s is None and "generated-token" in pool.reason


def _status(finished: int, dropped: int, stale: int, reasons: dict[str, int], in_flight: float = 64) -> Status:
    return Status(state="running", model="tiny", policy_version=3, step=3, episodes=EpisodeCounts(),
                  throughput={"in_flight": in_flight}, drop_reasons=reasons,
                  recent=RecentCounts(finished=finished, dropped=dropped, dropped_stale=stale))


def test_status_names_the_fix_only_when_over_five_percent_of_recent_episodes_dropped() -> None:
    config = {"max_staleness": 1, "batch_groups": 4, "group_size": 8, "admission": True}
    assert drop_fix(_status(100, 5, 5, {"older than max_staleness=1": 5}), config) is None  # 5%: fine
    assert drop_fix(_status(0, 0, 0, {}), config) is None
    line = drop_fix(_status(100, 30, 30, {"older than max_staleness=1": 30}, in_flight=128), config)
    assert line is not None and line.startswith("30% of the last minute's 100 finished episodes were dropped")
    assert "max_staleness=3" in line and "--concurrency" in line and "admission" not in line  # 128 in flight / 32
    off = drop_fix(_status(100, 30, 30, {"older than max_staleness=1": 30}), {**config, "admission": False})
    assert off is not None and "swarm config admission=true" in off
    other = drop_fix(_status(100, 10, 0, {"group below min_group_size or rewards identical": 10}), config)
    assert other is not None and "group below min_group_size" in other and "max_staleness" not in other
