"""Analysis of runs written to disk, the verdict wording, budgets, and the one-writer lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from evidence_inputs import summarize

from researcher.cli import parse_duration
from researcher.findings import verdicts
from researcher.runs import record as runs
from researcher.study import store
from researcher.study.layout import StudyLayout
from swarm.protocol import StepMetrics


def _write_run(run_dir: Path, rewards: list[float]) -> None:
    run_dir.mkdir(parents=True)
    runs.append_metrics(run_dir, [StepMetrics(step=i + 1, policy_version=i + 1, time=time.time(),
                                              metrics={"train/reward_mean": r}) for i, r in enumerate(rewards)])


def _trials(tmp_path: Path, curves: dict[tuple[str, int], list[float]], status: str = "finished") -> list[dict]:
    trials = []
    for index, ((name, seed), rewards) in enumerate(curves.items()):
        run_dir = tmp_path / f"run{index}"
        _write_run(run_dir, rewards)
        trials.append({"trial": index, "key": f"s/1/{index}", "experiment": name, "seed": seed,
                       "run_dir": str(run_dir), "status": status})
    return trials


EXPERIMENTS = [{"name": "small", "overrides": {"group_size": 2}}, {"name": "large", "overrides": {"group_size": 8}}]


def test_clear_difference_gives_a_yes_with_numbers(tmp_path: Path) -> None:
    trials = _trials(tmp_path, {("small", 1): [0.0, 0.1, 0.1, 0.2], ("small", 2): [0.0, 0.1, 0.2, 0.2],
                                ("large", 1): [0.1, 0.4, 0.6, 0.7], ("large", 2): [0.1, 0.45, 0.6, 0.75]})
    summary = summarize(1, "group_size", "train/reward_mean", 4, EXPERIMENTS, trials, 0.02, None)
    assert summary.best == "large" and summary.best_value == 8
    assert summary.comparison.clear is True
    answer, caveats = verdicts.verdict("q", [summary])
    # The runs log no train/episodes: the registered per-episode axis is missing, and the Answer opens with that.
    assert answer.startswith("Judged per training step, not per episode consumed as registered: the runs record no "
                             "episodes to judge on; per training step every arm has at least 4. Yes: "), answer
    assert verdicts.answer_class(answer) is verdicts.Verdict.YES and "group_size=8" in answer and "95% CI" in answer
    assert "per training step" in caveats


def test_overlapping_results_are_inconclusive_and_crashes_are_excluded(tmp_path: Path) -> None:
    trials = _trials(tmp_path, {("small", 1): [0.1, 0.3, 0.5], ("small", 2): [0.0, 0.0, 0.1],
                                ("large", 1): [0.1, 0.2, 0.3], ("large", 2): [0.0, 0.1, 0.2]})
    trials.append({"trial": 9, "key": "s/1/9", "experiment": "large", "seed": 3, "run_dir": str(tmp_path / "none"),
                   "status": "crashed"})
    summary = summarize(1, "group_size", "train/reward_mean", 3, EXPERIMENTS, trials, 0.02, None)
    answer, caveats = verdicts.verdict("q", [summary])
    assert answer.startswith("Inconclusive")
    assert "1 run(s) did not finish cleanly (crashed)" in caveats
    large = next(r for r in summary.experiments if r.name == "large")
    assert large.statuses == ["finished", "finished", "crashed"] and len(large.aucs) == 2


def test_plateau_needs_a_resolved_comparison_not_one_noisy_seed(tmp_path: Path) -> None:
    experiments = [{"name": "it2-8", "overrides": {"group_size": 8}}, {"name": "it2-16", "overrides": {"group_size": 16}}]
    incumbent = {"name": "it1-8", "value": 8}
    # One seed per arm: the CI of the difference is unbounded, so "plateau" would be a claim from noise.
    one_seed = _trials(tmp_path / "one", {("it2-8", 1): [0.2, 0.4, 0.5], ("it2-16", 1): [0.2, 0.4, 0.5]})
    assert summarize(2, "group_size", "train/reward_mean", 3, experiments, one_seed, 0.02,
                              incumbent).plateau is None
    # Three seeds each, the challenger's gain bounded below min_effect: a plateau the evidence supports.
    seeds = {("it2-8", s): [0.2, 0.4, 0.5 + 0.001 * s] for s in (1, 2, 3)}
    seeds |= {("it2-16", s): [0.2, 0.4, 0.5 + 0.001 * s] for s in (1, 2, 3)}
    summary = summarize(2, "group_size", "train/reward_mean", 3, experiments,
                                 _trials(tmp_path / "three", seeds), 0.02, incumbent)
    assert summary.plateau and "plateaued" in summary.plateau


def test_cut_runs_are_compared_over_the_steps_all_reached(tmp_path: Path) -> None:
    trials = _trials(tmp_path, {("small", 1): [0.0, 0.1, 0.2, 0.9, 0.9, 0.9], ("large", 1): [0.0, 0.1, 0.2]})
    summary = summarize(1, "group_size", "train/reward_mean", 6, EXPERIMENTS, trials, 0.02, None)
    assert summary.horizon == 3
    assert [r.auc.mean for r in summary.experiments] == pytest.approx([0.1, 0.1])


def test_durations() -> None:
    assert parse_duration("10m") == 600 and parse_duration("1h30m") == 5400 and parse_duration("45s") == 45
    for bad in ("", "10", "ten", "0m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_second_writer_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    layout = StudyLayout("locked", tmp_path / "s", tmp_path / "a")
    layout.artifacts_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               f"lock = FileLock({str(layout.lock_file)!r}); lock.acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(store.StudyBusy, match="already being run by another researcher process"):
            with store.study_lock(layout):
                pass
    finally:
        holder.kill()
        holder.wait()
    with store.study_lock(layout):  # free again once the holder is gone
        pass
