"""What a reviewer meets in MLflow first (a real SQLite store): the arm as a tag and a run-name prefix that
survives the runs list's truncation, no flat-zero ``context/*`` charts, links that open the training view."""

from __future__ import annotations

from pathlib import Path

from researcher.nodes.launch_runs import _arm_letter
from researcher.tracking import Tracker
from swarm.protocol import StepMetrics


def test_context_metrics_are_logged_only_once_they_move(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art")
    run = tracker.start_child("study", None, "A it1-g8 s0", {"lr": 0.1}, {"arm": "it1-g8"})

    def step(n: int, forks: float) -> StepMetrics:
        return StepMetrics(step=n, policy_version=n, time=1000.0 + n,
                           metrics={"train/reward_mean": 0.1 * n, "context/forks": forks, "context/merged": 0.0})

    tracker.log_steps(run, [step(1, 0.0), step(2, 0.0)])
    tracker.log_steps(run, [step(3, 2.0), step(4, 0.0)])
    real = tracker.real_id(run)
    logged = tracker.client.get_run(real).data
    assert "context/merged" not in logged.metrics  # zero all along: never charted
    history = tracker.client.get_metric_history(real, "context/forks")
    assert [(m.step, m.value) for m in history] == [(3, 2.0), (4, 0.0)]  # from the first move on, zeros too
    assert len(tracker.client.get_metric_history(real, "train/reward_mean")) == 4
    assert logged.tags["arm"] == "it1-g8"


def test_run_names_start_with_the_arm_letter() -> None:
    trials = [{"experiment": e, "seed": s} for e in ("it2-group-size-16", "it2-group-size-8") for s in (0, 1)]
    state = {"trials": trials}
    assert [_arm_letter(state, t) for t in trials] == ["A", "A", "B", "B"]  # type: ignore[arg-type]
