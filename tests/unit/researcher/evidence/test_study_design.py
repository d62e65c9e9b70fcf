"""A study's design before any run: arms matched on episodes consumed, the pilot's sizing within the
budget, and each look's seeds and information fraction; then matched arms judged over the shared episode
window by the paired interval."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from evidence_inputs import finished_trials, summarize

from researcher.evidence import sizing
from researcher.findings.records import Comparison, Evidence, IterationSummary, LookPlan
from researcher.planner import arm_budgets
from researcher.runs import record as runs
from researcher.session.nodes import write_report
from swarm.protocol import StepMetrics

EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"


def test_arms_that_consume_different_episodes_a_step_train_to_the_same_episodes() -> None:
    budgets = arm_budgets.matched({"g2": {"group_size": 2, "batch_groups": 4}, "g8": {"group_size": 8}}, 30, 5)
    assert budgets == {"g2": arm_budgets.ArmBudget(120, 960, 20), "g8": arm_budgets.ArmBudget(30, 960, 5)}
    # A ratio that does not divide: the smaller arm trains at least the same episodes, rounds about as often.
    odd = arm_budgets.matched({"a": {"group_size": 3, "batch_groups": 4}, "b": {"group_size": 8, "batch_groups": 4}},
                              30, 5)
    assert odd["a"] == arm_budgets.ArmBudget(80, 960, 13) and odd["b"].episodes == 960
    # A batch-size knob is matched the same way.
    assert arm_budgets.matched({"a": {"batch_groups": 2}, "b": {"batch_groups": 4}}, 8, 5) == {
        "a": arm_budgets.ArmBudget(16, 256, 10), "b": arm_budgets.ArmBudget(8, 256, 5)}


def test_arms_with_the_same_batch_keep_the_plan_and_the_clients_cadence() -> None:
    budgets = arm_budgets.matched({"lr1": {"lr": 1e-3}, "lr2": {"lr": 3e-3}}, 30, 5)
    assert budgets == {"lr1": arm_budgets.ArmBudget(30, 960), "lr2": arm_budgets.ArmBudget(30, 960)}


def test_the_clients_cadence_is_read_from_its_source(tmp_path: Path) -> None:
    assert arm_budgets.client_eval_every(EXAMPLES / "letters" / "client.py") == 5
    (tmp_path / "c.py").write_text("EVAL_EVERY = 7\n")
    (tmp_path / "bad.py").write_text("EVAL_EVERY = (\n")
    assert arm_budgets.client_eval_every(tmp_path / "c.py") == 7
    assert arm_budgets.client_eval_every(tmp_path / "bad.py") == arm_budgets.DEFAULT_EVAL_EVERY


def _pilot(diff: float, sd: float) -> Comparison:
    return Comparison(better="a", worse="b", diff=diff, sd=sd, paired=True, seeds=3, look=1)


def test_the_pilot_sizes_the_study_to_what_the_budget_runs() -> None:
    design = sizing.register(3, 3)
    assert sizing.pilot_look(design) == LookPlan(look=1, seeds=3, fraction=None)
    # 600 s left, 60 s a run, two at a time, two arms: each of 2 looks gets (300 - 30) // 60 = 4 waves = 4 seeds.
    room = sizing.Room(time_left_s=600, run_s=60, parallel=2, runs_left=100, arms=2)
    sized = sizing.size(design, _pilot(0.1, 0.05), room, 0.02)
    assert sized.max_seeds == 3 + 2 * 4 and sized.reachable and sized.needed_seeds is not None
    assert sized.sizing.startswith("Sized from the pilot: the pilot's spread (paired difference sd 0.0500) needs")
    look2 = sizing.next_look(sized, sizing.pilot_look(sized), room)
    assert look2 == LookPlan(look=2, seeds=7, fraction=7 / 11)
    look3 = sizing.next_look(sized, look2, sizing.Room(300, 60, 2, 92, 2))
    assert look3 is not None and look3.seeds == 11 and look3.fraction == 1.0  # the last spends what is left
    assert sizing.next_look(sized, look3, room) is None  # no look past the registered count


def test_a_budget_that_cannot_decide_says_so_with_the_seeds_and_hours_needed() -> None:
    room = sizing.Room(time_left_s=400, run_s=60, parallel=2, runs_left=100, arms=2)
    sized = sizing.size(sizing.register(3, 3), _pilot(0.0, 0.05), room, 0.01)
    assert sized.reachable is False and sized.needed_seeds is not None and sized.needed_seeds > sized.max_seeds
    assert sized.sizing.startswith("The budget cannot decide this: the pilot's spread (paired difference sd 0.0500) "
                                   f"needs about {sized.needed_seeds} seeds an arm to resolve ±0.01 at 80% power")
    assert "hours more here" in sized.sizing and f"the budget runs only {sized.max_seeds}" in sized.sizing


def test_a_pilot_that_already_has_the_seeds_needed_says_so_rather_than_zero_minutes() -> None:
    room = sizing.Room(time_left_s=3600, run_s=600, parallel=2, runs_left=100, arms=2)
    sized = sizing.size(sizing.register(3, 4), _pilot(0.5, 2.5), room, 5.0)
    assert sized.needed_seeds is not None and sized.needed_seeds <= 4
    assert "no more than the pilot ran" in sized.sizing and "minutes" not in sized.sizing


def test_a_single_registered_look_is_a_fixed_design() -> None:
    design = sizing.register(1, 3)
    assert sizing.pilot_look(design).fraction == 1.0


def test_a_budget_that_runs_no_seed_plans_no_look() -> None:
    sized = sizing.size(sizing.register(3, 3), _pilot(0.1, 0.05), sizing.Room(40, 60, 2, 100, 2), 0.02)
    assert sized.max_seeds == 3 and sizing.next_look(sized, sizing.pilot_look(sized), sizing.Room(40, 60, 2, 100, 2)) \
        is None


def _write(run_dir: Path, steps: int, episodes: int, slope: float, every: int, rng: random.Random, shift: float) -> None:
    """A run of ``steps`` steps consuming ``episodes`` each, its held-out reward rising ``slope`` per episode."""
    run_dir.mkdir(parents=True)
    rows = []
    for step in range(1, steps + 1):
        metrics = {"train/reward_mean": 0.1, "train/episodes": float(episodes)}
        if step % every == 0:
            metrics |= {"eval/reward_mean": min(1.0, slope * step * episodes + shift + rng.gauss(0, 0.005)),
                        "eval/step": float(step)}
        rows.append(StepMetrics(step=step, policy_version=step, time=1_700_000_000.0 + step, metrics=metrics))
    runs.append_metrics(run_dir, rows)


def test_matched_arms_are_judged_over_the_whole_shared_episode_window_by_paired_seeds(tmp_path: Path) -> None:
    rng = random.Random(3)
    trials = []
    for seed in range(4):
        shift = rng.gauss(0, 0.05)  # what a seed's task order does to both arms alike
        for name, steps, episodes, every, slope in (("g2", 120, 8, 20, 0.0008), ("g8", 30, 32, 5, 0.0006)):
            run_dir = tmp_path / f"{name}-{seed}"
            _write(run_dir, steps, episodes, slope, every, rng, shift)
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    experiments = [{"name": "g2", "overrides": {"group_size": 2}}, {"name": "g8", "overrides": {"group_size": 8}}]
    study = summarize(1, "group_size", "eval/reward_mean", 30, experiments, trials, 0.02).study
    assert study is not None and study.axis == "episode" and not study.switch
    assert study.budgets["episode"] == 960  # not the 240 episodes g2 had consumed by step 30
    assert {r.name: r.rounds["episode"] for r in study.arms} == {"g2": 6, "g8": 6}
    c = study.comparison
    assert c is not None and c.paired and c.seeds == 4 and c.better == "g2"
    # The shared shift cancels in the pairs: the paired interval is far narrower than the arms' spread.
    assert c.hw is not None and c.hw < study.noise_floor["episode"].sd
    assert c.diff == pytest.approx(0.0002 * 480, abs=0.02)  # slope gap x mean episodes over the window


def _summary(diff: float, hw: float | None, look: int, fraction: float | None) -> IterationSummary:
    c = Comparison(better="a", worse="b", diff=diff, hw=hw, hw95=0.05, seeds=3 * look, look=look, fraction=fraction,
                   boundary_z=2.2 if fraction else None, paired=True)
    return IterationSummary(iteration=look, knob="lr", comparison=c,
                            study=Evidence(knob="lr", metric="eval/reward_mean", min_effect=0.02))


def test_the_report_shows_every_look_and_the_answer_says_why_the_study_ended() -> None:
    design = sizing.register(3, 3).model_copy(update={"max_seeds": 9, "sizing": "Sized from the pilot: …",
                                                      "reachable": True})
    history = [_summary(0.2, None, 1, None), _summary(0.15, 0.05, 2, 0.66)]
    table = "\n".join(write_report.looks_section(history, design))
    assert "| 1 | 1 | 3 | pilot | ∞ | +0.200 (pilot: no decision) | ± 0.050 | Inconclusive |" in table
    assert "| 2 | 2 | 6 | 0.66 | 2.200 | +0.150 ± 0.050 | ± 0.050 | Yes |" in table
    assert "up to 3 looks, obrien-fleming alpha spending of 0.045 for a false-positive rate at or below 0.05" in table
    assert write_report.with_design("Yes: …", history, design, 240.0) == (
        "Yes: … Settled at look 2 of 3: the study ended early, with about 4 minutes of its budget left.")
    short = design.model_copy(update={"reachable": False, "sizing": "The budget cannot decide this: …"})
    unsettled = [history[0], _summary(0.01, 0.05, 2, 0.66)]
    assert write_report.with_design("Inconclusive: …", unsettled, short, 0.0) == (
        "Inconclusive: … The budget cannot decide this: …")
    assert write_report.with_design("Inconclusive: …", unsettled, None, 0.0) == "Inconclusive: …"


def test_a_knob_that_changes_tokens_per_episode_offers_per_generated_token(tmp_path: Path) -> None:
    tokens = {"short": 8.0, "long": 32.0}
    trials = finished_trials(tmp_path, ["short", "long"], 2, 8, lambda name, seed, step: {
        "train/reward_mean": 0.1 * step + 0.01 * seed, "train/episodes": 32.0,
        "context/generated_tokens": 32 * tokens[name]})
    experiments = [{"name": "short", "overrides": {"max_tokens": 8}}, {"name": "long", "overrides": {"max_tokens": 32}}]
    study = summarize(1, "max_tokens", "train/reward_mean", 8, experiments, trials, 0.02).study
    assert study is not None and study.measured == ["step", "episode", "second", "token"]
    assert study.axis == "step" and study.budgets["token"] == 8 * 32 * 8  # the short arm's tokens: every run reached
    assert "token" in study.axes_compared and "AUC per generated token" in "\n".join(write_report.evidence_section(study))
    other = summarize(1, "lr", "train/reward_mean", 8, [{**e, "overrides": {"lr": i + 1.0}} for i, e in
                                                         enumerate(experiments)], trials, 0.02).study
    assert other is not None and "token" not in other.measured
    assert "per generated token" not in "\n".join(write_report.evidence_section(other))
