"""Figures and the review agree with the Answer: a study whose arms ran 120 and 30 steps (group sizes 2
and 8, matched on 960 episodes), rendered through the analyze node and ``researcher report``'s writer
from recorded metrics on a real study layout and MLflow SQLite store.

Before, the figures cut every arm at the per-step horizon (30 steps): group size 2 was drawn to 240 of
its 960 episodes, flat near its start, under group size 8, while the Answer (per episode consumed) has
group size 2 far ahead; the review gave it a final reward from step 30 too."""

from __future__ import annotations

import csv
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import pytest

from researcher.evidence import plots, run_table, stats
from researcher.findings import verdicts
from researcher.findings.records import Comparison, IterationPlan, IterationSummary
from researcher.planner.offline import OfflinePlanner
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.session.nodes import analyze
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings, StudyOptions
from researcher.types.usage import new_usage
from swarm.protocol import StepMetrics

EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"
EPISODES = 960  # both arms' budget: group size 2 in 120 steps of 8 episodes, group size 8 in 30 of 32


def _record_run(run_dir: Path, steps: int, per_step: int, every: int, level: float, seed: int) -> None:
    """Metrics as the server records them: a training row per step, held-out rounds (at ``eval/step``) every
    ``every`` steps from step 0; held-out reward ``level`` x the share of the episode budget consumed."""
    rows = []
    for step in range(steps + 1):
        metrics: dict[str, float] = {}
        consumed = step * per_step
        if step:
            metrics |= {"train/reward_mean": level * consumed / EPISODES, "train/episodes": float(per_step)}
        if step % every == 0:
            metrics |= {"eval/reward_mean": min(1.0, 0.05 + level * consumed / EPISODES + 0.01 * seed),
                        "eval/step": float(step)}
        rows.append(StepMetrics(step=step, policy_version=step, time=100.0 + 2.0 * step, metrics=metrics))
    runs.append_metrics(run_dir, rows)


@pytest.fixture
def study(tmp_path: Path) -> tuple[StudyLayout, dict]:
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=EXAMPLES.parents[1] / "prompts")
    layout = StudyLayout("unequal", settings.studies_root, settings.artifacts_root)
    layout.ensure()
    framing = {"answerable": True, "reason": "named", "question": "group size 2 vs 8", "task": "letters",
               "knob": "group_size", "metric": "eval/reward_mean"}
    experiments = [{"name": "g2", "overrides": {"group_size": 2}}, {"name": "g8", "overrides": {"group_size": 8}}]
    studyfiles.write_plan(layout, 1, IterationPlan.model_validate(
        {"experiments": experiments, "hypotheses": [], "steps_per_run": 30, "shape": "comparison",
         "stage": "initial"}), framing)
    trials = []
    arms = {"g2": (120, 8, 20, 0.95), "g8": (30, 32, 5, 0.45)}  # steps, episodes a step, eval cadence, level
    for index, (name, seed) in enumerate((n, s) for n in arms for s in range(3)):
        steps, per_step, every, level = arms[name]
        run_dir = layout.run_dir(1, index)
        run_dir.mkdir(parents=True)
        _record_run(run_dir, steps, per_step, every, level, seed)
        runs.save(run_dir, runs.RunRecord(key=f"unequal/1/{index}", study_id="unequal", iteration=1, trial=index,
                                          experiment=name, seed=seed, config={}, client="c.py", target_step=steps,
                                          episodes=EPISODES, group_size=per_step // 4, status="finished",
                                          last_step=steps, launches=1))
        trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art")
    ctx = StudyContext(settings, layout, OfflinePlanner(["letters"]), tracker, Launcher(settings.swarm_command))
    now = time.time()
    state = {"study_id": "unequal", "topic": "Does a larger GRPO group size make letters learn faster?",
             "framing": framing, "iteration": 1, "trials": trials, "iterations": [], "llm": new_usage(),
             "options": StudyOptions(seeds=3, max_runs=6).model_dump(),
             "budget": budget.make_budget(now, now + 3600, max_runs=6, max_iterations=1, max_repairs=3,
                                          max_llm_tokens=0, max_llm_cost_usd=0.0)}
    return layout, analyze.analyze(state, ctx)  # type: ignore[arg-type]


def _read(path: Path) -> dict[tuple[str, str], dict[int, list[tuple[float, float]]]]:
    """A figure's CSV as (arm, axis) -> seed -> its points."""
    found: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as f:
        for row in csv.DictReader(f):
            found[(row["arm"], row["axis"])][int(row["seed"])].append((float(row["x"]), float(row["y"])))
    return found


def test_every_arm_is_drawn_over_the_judged_window_in_the_answers_order(study: tuple[StudyLayout, dict]) -> None:
    layout, out = study
    summary = IterationSummary.model_validate(out["iterations"][-1])
    evidence = summary.study
    assert evidence is not None and evidence.axis == "episode" and evidence.metric == "eval/reward_mean"
    assert evidence.budgets["episode"] == EPISODES and evidence.budgets["step"] == 30
    answer, _ = verdicts.verdict("q", [summary])
    assert answer.startswith("No: the larger group_size (8) learned slower per episode consumed"), answer
    figures = layout.study_dir / "figures"
    for name in ("axes", "iteration-1"):
        assert (figures / f"{name}.png").stat().st_size > 1000
        data = _read(figures / f"{name}.csv")
        assert {arm for arm, _ in data} == {"group_size=2", "group_size=8"}
        for (arm, axis), seeds in data.items():
            window = evidence.budgets[axis]
            assert len(seeds) == 3
            for points in seeds.values():  # every run drawn whole over the window, and not past it
                assert max(x for x, _ in points) == pytest.approx(window), (name, arm, axis)
                assert all(0 <= x <= window + 1e-9 for x, _ in points)
        # The verdict panel: each arm's plotted seeds score what the verdict averaged, in the Answer's order.
        plotted = {arm: sum(stats.auc_until(*zip(*pts, strict=True), evidence.budgets["episode"])
                            for pts in seeds.values()) / len(seeds)
                   for (arm, axis), seeds in data.items() if axis == "episode"}
        for arm in evidence.arms:
            assert plotted[arm.label] == pytest.approx(arm.axes["episode"].mean)
        assert max(plotted, key=plotted.__getitem__) == evidence.comparison.better_label == "group_size=2"
    # Group size 2's curve reaches its 960th episode, at held-out 1.0: not the 240 episodes of step 30.
    g2 = _read(figures / "axes.csv")[("group_size=2", "episode")]
    assert all(points[-1] == (EPISODES, 1.0) for points in g2.values())


def test_the_review_repeats_the_reports_numbers(study: tuple[StudyLayout, dict]) -> None:
    layout, out = study
    evidence = IterationSummary.model_validate(out["iterations"][-1]).study
    assert evidence is not None
    written = run_table.write(layout, "eval/reward_mean")
    with written.csv.open() as f:
        table = list(csv.DictReader(f))
    for arm in evidence.arms:
        mine = [r for r in table if json.loads(r["config"]) == arm.overrides]
        assert sorted(float(r["final_reward"]) for r in mine) == pytest.approx(sorted(round(v, 4) for v in arm.finals))
        assert sorted(float(r["auc_episode"]) for r in mine) == pytest.approx(
            sorted(round(v, 4) for v in arm.scores["episode"]))
        assert {r["verdict"] for r in mine} == {"keep" if arm.name == evidence.best else "discard"}
    g2 = [float(r["final_reward"]) for r in table if r["experiment"] == "g2"]
    assert min(g2) > 0.6  # where its 120 steps took it (its last five rounds), not its level by step 30 (< 0.3)
    review_figure = _read(layout.study_dir / "figures" / "review.csv")
    assert {axis for _, axis in review_figure} == {"episode"}
    assert (layout.study_dir / "review.md").read_text().count("| keep |") == 3


def test_the_looks_figure_puts_each_look_against_its_boundary(tmp_path: Path) -> None:
    def summary(iteration: int, diff: float, hw: float, boundary: float | None, fraction: float | None) -> IterationSummary:
        c = Comparison(better="a", worse="b", better_label="lr=0.001", worse_label="lr=0.0001", diff=diff, hw=hw,
                       look=iteration, fraction=fraction, boundary_z=boundary, hw95=0.02, clear=diff - hw > 0)
        return IterationSummary(iteration=iteration, knob="lr", comparison=c)

    history = [summary(1, 0.01, math.inf, None, None), summary(2, 0.02, 0.025, 2.96, 0.5),
               summary(3, 0.03, 0.02, 1.97, 1.0)]
    path = plots.looks(history, tmp_path / "looks.png", "looks")
    assert path is not None and path.stat().st_size > 1000
    with path.with_suffix(".csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["x"]) for r in rows] == [1, 2, 3] and rows[0]["boundary"] == ""
    assert float(rows[0]["y"]) == pytest.approx(1.96 * 0.01 / 0.02, abs=1e-3)  # the pilot: plain 95% scale
    for row, c in zip(rows[1:], history[1:], strict=True):  # crosses its boundary exactly when it decided
        assert (abs(float(row["y"])) >= float(row["boundary"])) == c.comparison.clear
    assert plots.looks([IterationSummary(iteration=1, knob="lr")], tmp_path / "none.png", "no looks") is None
