"""A study driven node by node on a real layout, MLflow store and offline planner, with no servers: the
tests call the graph's nodes themselves and write each run's metrics as the monitor writes them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from researcher.planner.offline import OfflinePlanner
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings, StudyOptions
from researcher.types.usage import new_usage
from swarm.protocol import StepMetrics

EXAMPLES = Path(__file__).resolve().parents[3] / "studies" / "examples"


def node_study(tmp_path: Path, study_id: str, topic: str, options: StudyOptions, *, run_s: float, runs_launched: int,
               budget_s: float, emit: Callable[[str, dict[str, Any]], None] | None = None
               ) -> tuple[StudyContext, dict[str, Any]]:
    """The study's context and its state before its first plan: ``runs_launched`` runs of ``run_s`` seconds
    measured, ``budget_s`` seconds to its deadline."""
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=EXAMPLES.parents[1] / "prompts")
    layout = StudyLayout(study_id, settings.studies_root, settings.artifacts_root)
    layout.ensure()
    planner = OfflinePlanner(["letters"])
    ctx = StudyContext(settings, layout, planner, Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art"),
                       Launcher(settings.swarm_command), emit=emit or (lambda event, data: None))
    now = time.time()
    state: dict[str, Any] = {
        "study_id": study_id, "topic": topic, "iteration": 0, "iterations": [], "llm": new_usage(),
        "framing": planner.frame(topic, "").value.model_dump(), "run_seconds": [run_s] * runs_launched,
        "runs_launched": runs_launched, "options": options.model_dump(),
        "budget": budget.make_budget(now, now + budget_s, max_runs=16, max_iterations=options.max_iterations,
                                     max_repairs=3, max_llm_tokens=1000, max_llm_cost_usd=0.0)}
    return ctx, state


def finish_trials(state: dict[str, Any], reward: Callable[[dict[str, Any]], float], steps: int = 8) -> None:
    """Every trial of the iteration finished with a flat ``train/reward_mean`` curve at ``reward(trial)``."""
    now = time.time()
    for trial in state["trials"]:
        Path(trial["run_dir"]).mkdir(parents=True)
        runs.append_metrics(Path(trial["run_dir"]), [StepMetrics(step=s, policy_version=s, time=now + s, metrics={
            "train/reward_mean": reward(trial), "train/episodes": 32.0}) for s in range(1, steps + 1)])
        trial["status"] = "finished"
