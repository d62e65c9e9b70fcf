"""Tests build runs and plans as plain dicts (as a study's files hold them); these read them into the
typed inputs of ``researcher.evidence.analysis``, the way the analyze node does from plan.json and the state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from researcher.evidence import analysis
from researcher.findings.records import Evidence, IterationSummary, PlannedExperiment


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
