"""Tests build runs and plans as plain dicts (as a study's files hold them); these read them into the
typed inputs of ``researcher.evidence.analysis``, the way the analyze node does from plan.json and the state."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from researcher.evidence import analysis
from researcher.findings.records import Evidence, IterationSummary, PlannedExperiment
from researcher.runs import record as runs
from swarm.protocol import StepMetrics


def trial_runs(trials: Iterable[Mapping[str, object]]) -> list[analysis.TrialRun]:
    fields = ("experiment", "run_dir", "status", "overrides", "iteration", "seed")
    return [analysis.TrialRun(**{k: t[k] for k in fields if k in t}) for t in trials]  # type: ignore[arg-type]


def summarize(iteration: int, knob: str, metric: str, horizon: int, experiments: Sequence[Mapping[str, object]],
              trials: Iterable[Mapping[str, object]], min_effect: float, previous: Mapping[str, object] | None = None,
              earlier: Iterable[Mapping[str, object]] = (), shape: str | None = None) -> IterationSummary:
    runs = analysis.IterationRuns(iteration, PlannedExperiment.load_all(list(experiments)), trial_runs(trials),
                                  previous["value"] if previous else None, trial_runs(earlier))
    return analysis.summarize(analysis.Judging(knob, metric, horizon, min_effect, shape), runs)


def evidence(knob: str, metric: str, horizon: int, trials: Iterable[Mapping[str, object]], min_effect: float,
             shape: str | None = None) -> Evidence:
    return analysis.evidence(analysis.Judging(knob, metric, horizon, min_effect, shape), trial_runs(trials))


def finished_trials(tmp: Path, arms: Sequence[str], seeds: int, steps: int,
                    metrics: Callable[[str, int, int], dict[str, float]], start: float = 100.0) -> list[dict[str, object]]:
    """Finished trials of each arm and seed, whose run dirs hold ``metrics(arm, seed, step)`` at steps
    1..``steps`` (a second apart from ``start``), as the monitor writes them."""
    trials: list[dict[str, object]] = []
    for name in arms:
        for seed in range(seeds):
            run_dir = tmp / f"{name}-{seed}"
            run_dir.mkdir()
            runs.append_metrics(run_dir, [StepMetrics(step=s, policy_version=s, time=start + s, metrics=metrics(name, seed, s))
                                          for s in range(1, steps + 1)])
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    return trials
