"""Turn runs into evidence: per configuration, mean ± 95% CI of the area under the reward curve on
three axes (per training step, per episode consumed, per wall-clock second) and of the final reward;
the noise floor; and the comparison of the best configuration with the runner-up.

Seeds of the same configuration (same overrides) are pooled across iterations, so the seeds a
replicate iteration adds narrow the interval of the comparison it re-ran, and the answer reads the
whole study. Verdicts use the metric the hypotheses registered (``train/reward_mean`` registers the
reward: its held-out ``eval/reward_mean`` where every run holds it) on the knob's primary axis, over a
window in which every arm has at least ``window.MIN_ROUNDS`` points of that metric; where the budget leaves an
arm short, the verdict moves to the axis (then the metric) that has the evidence, and ``Evidence.switch``
says why. Results are small dicts (they go into the graph state and analysis.json);
curves are read from each run's metrics.jsonl; ``researcher.findings.verdicts`` words the answer from them.
``backfill`` gives summaries written before pooled evidence existed their ``study``, from the runs on disk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from researcher.evidence import stats, window
from researcher.evidence.looks import Look
from researcher.findings import verdicts
from researcher.findings.axes import AXES, EVAL_METRIC, TOKENS_METRIC, TRAIN_METRIC, offered_axes, primary_axis
from researcher.findings.axes import AXIS_TEXT as AXIS_TEXT  # re-exported for plots and reports
from researcher.findings.axes import AXIS_UNIT as AXIS_UNIT
from researcher.findings.records import (
    OK_STATUSES,
    Arm,
    Cell,
    Comparison,
    Evidence,
    IterationSummary,
    JsonObject,
    Noise,
    PlannedExperiment,
    arm_key,
)
from researcher.runs import record as runs
from researcher.study.layout import StudyLayout

MIN_POINTS = 3
MIN_EVAL_POINTS = 2  # held-out evaluation runs every few steps: fewer points per run
SWEEP_MIN = 4  # a curve needs at least this many values


class Curve(NamedTuple):
    steps: list[int]
    episodes: list[float]  # cumulative train/episodes up to and including each step
    seconds: list[float]   # StepMetrics time since the run's first step
    values: list[float]
    tokens: list[float]    # cumulative generated tokens (context/generated_tokens) up to each step

    def axis(self, name: str) -> Sequence[float]:
        axes: dict[str, Sequence[float]] = {"step": self.steps, "episode": self.episodes, "second": self.seconds,
                                            "token": self.tokens}
        return axes[name]


def _empty() -> Curve:
    return Curve([], [], [], [], [])


class _Row(NamedTuple):
    time: float
    metrics: dict[str, float]


def read_axes(run_dir: Path, metric: str, horizon: int | None = None) -> Curve:
    """One metric of one run on all three axes; a step logged twice (a crash between writes) counts once.

    Held-out ``eval/*`` values are placed at ``eval/step``, the policy they evaluated (the server
    merges a finished round into that step's row; step 0, the untrained policy: no episodes, 0 s)."""
    file = run_dir / runs.METRICS_FILE
    if not file.is_file():
        return _empty()
    by_step: dict[int, _Row] = {}
    for line in file.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            merged = by_step.setdefault(int(item["step"]), _Row(float(item["time"]), {}))
            merged.metrics.update(item.get("metrics", {}))
    at: dict[int, tuple[float, float, float]] = {}  # step -> (cumulative episodes, seconds since the first, tokens)
    points: dict[int, float] = {}
    episodes, tokens, start = 0.0, 0.0, None
    for step in sorted(by_step):
        item = by_step[step]
        episodes += float(item.metrics.get("train/episodes", 0.0))
        tokens += float(item.metrics.get(TOKENS_METRIC, 0.0))
        start = item.time if start is None else start
        at[step] = (episodes, item.time - start, tokens)
        value = item.metrics.get(metric)
        if value is not None:
            points[int(item.metrics.get("eval/step", step)) if metric.startswith("eval/") else step] = float(value)
    curve = _empty()
    for step in sorted(s for s in points if horizon is None or s <= horizon):
        eps, seconds, spent = at.get(step, (0.0, 0.0, 0.0))
        curve.steps.append(step)
        curve.episodes.append(eps)
        curve.seconds.append(seconds)
        curve.tokens.append(spent)
        curve.values.append(points[step])
    return curve


def choose_metric(requested: str, run_dirs: Iterable[Path]) -> tuple[str, str]:
    """(metric, sentence saying which and why): held-out evaluation when every usable run (pass only
    runs that ended cleanly: a crash before the first evaluation must not veto it) with a training curve
    also holds ``eval/reward_mean`` at ``MIN_EVAL_POINTS`` steps or more. ``train/reward_mean`` registers
    the reward (held-out where it can); a registered ``eval/reward_mean`` falls back to the training
    reward only where a run lacks it, and ``summarize`` opens the Answer with that switch."""
    if requested not in (TRAIN_METRIC, EVAL_METRIC):
        return requested, f"Verdicts use `{requested}`, the metric the plan judges."
    trained = [d for d in run_dirs if read_axes(d, TRAIN_METRIC).steps]
    lacking = [d for d in trained if len(read_axes(d, EVAL_METRIC).steps) < MIN_EVAL_POINTS]
    if trained and not lacking:
        return EVAL_METRIC, (f"Verdicts use `{EVAL_METRIC}` (held-out evaluation at a fixed step interval), "
                             f"present in all {len(trained)} runs; `{TRAIN_METRIC}` is the sampled batch's reward.")
    return TRAIN_METRIC, (f"Verdicts use `{TRAIN_METRIC}` (the reward of the sampled training batch): not every run "
                          f"holds a held-out `{EVAL_METRIC}` ({len(lacking)} of {len(trained)} runs have fewer than "
                          f"{MIN_EVAL_POINTS} evaluation rounds).")


def _cell(values: Sequence[float]) -> Cell:
    e = stats.mean_ci(values)
    return Cell(mean=e.mean, hw=_finite(e.half_width), n=e.n)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Judging:
    """What the evidence is judged on: the varied knob, the metric (before ``choose_metric``), the steps
    each run trains, the smallest difference that matters and the plan's shape (None: by the arm count)."""

    knob: str
    metric: str
    horizon: int
    min_effect: float
    shape: str | None = None
    look: Look | None = None  # the registered look this analysis is (None: a plain 95% interval)


@dataclass(frozen=True)
class TrialRun:
    """One run as evidence: its experiment, the arm's settings, the iteration that ran it, its run dir
    and how it ended (a run.json's status)."""

    experiment: str
    run_dir: str
    status: str
    overrides: JsonObject = field(default_factory=dict)
    iteration: int = 0
    seed: int = 0


@dataclass
class _Group:
    overrides: JsonObject
    trials: list[TrialRun] = field(default_factory=list)
    name: str = ""
    value: object = None


def _score(groups: list[_Group], metric: str, horizon: int,
           offered: Sequence[str] = AXES) -> tuple[list[Arm], dict[str, float]]:
    """Each arm's per-seed AUC on every ``offered`` axis over budgets all its usable runs reached (an axis
    not offered, or with no budget, is not measured: its budget is 0)."""
    least = MIN_EVAL_POINTS if metric == EVAL_METRIC else MIN_POINTS
    curves = {id(t): read_axes(Path(t.run_dir), metric) for g in groups for t in g.trials}
    usable = [c for g in groups for t in g.trials if t.status in OK_STATUSES
              for c in [curves[id(t)]] if len(c.steps) >= least]
    if usable:
        # Runs cut by the deadline are compared with the others over the steps they all reached.
        horizon = min(horizon, min(c.steps[-1] for c in usable))
    # Each axis has its own window: the budget every usable run reached on it. Arms matched on episodes
    # train different steps (``planner.arm_budgets``), so the episode window is not cut at a step count.
    budgets = {a: float(horizon) if a == "step" else min((c.axis(a)[-1] for c in usable), default=0.0)
               if a in offered else 0.0 for a in AXES}
    rows = []
    for group in groups:
        row = Arm(name=group.name, value=group.value, overrides=group.overrides, statuses=[], aucs=[], finals=[],
                  runs=[], scores={a: [] for a in AXES}, seeds=[],
                  iterations=sorted({t.iteration for t in group.trials}),
                  rounds={}, reach={})  # set here, filled below: ``dump`` keeps only fields set
        for trial in group.trials:
            row.statuses.append(trial.status)
            c = curves[id(trial)]
            if trial.status not in OK_STATUSES or len(c.steps) < least or c.steps[0] > horizon:
                continue
            for axis in (a for a in AXES if a == "step" or budgets[a] > 0):
                inside = window.points_inside(c.axis(axis), budgets[axis])
                row.rounds[axis] = min(row.rounds.get(axis, inside), inside)
                reached = row.reach.get(axis, 0.0) * len(row.aucs) + c.axis(axis)[-1]
                row.reach[axis] = reached / (len(row.aucs) + 1)  # the mean over its runs
            cut = _cut(c, horizon)
            row.aucs.append(stats.auc(cut.steps, cut.values, horizon))
            row.finals.append(stats.final_level(c.values))  # where the run's own budget took it
            row.runs.append(trial.run_dir)
            row.seeds.append(trial.seed)
            row.scores["step"].append(row.aucs[-1])
            for axis in (a for a in AXES if a != "step" and budgets[a] > 0):
                row.scores[axis].append(stats.auc_until(c.axis(axis), c.values, budgets[axis]))
        if row.aucs:
            row.auc, row.final = _cell(row.aucs), _cell(row.finals)
            row.axes = {a: _cell(row.scores[a]) for a in AXES if row.scores[a]}
        rows.append(row)
    return rows, budgets


def _cut(c: Curve, horizon: int) -> Curve:
    """``c`` up to ``horizon``, ending at ``horizon`` where it goes past it: held-out evaluation runs every
    few steps and lands on different steps in different runs (``[0, 6, 8]``, ``[0, 7]``), so a run with no
    point at the shared horizon gets one interpolated there instead of being cut back to its start."""
    n = sum(1 for s in c.steps if s <= horizon)
    cut = Curve(c.steps[:n], c.episodes[:n], c.seconds[:n], c.values[:n], c.tokens[:n])
    if 0 < n < len(c.steps) and c.steps[n - 1] < horizon:
        w = (horizon - c.steps[n - 1]) / (c.steps[n] - c.steps[n - 1])
        cut.steps.append(horizon)
        for whole, part in ((c.episodes, cut.episodes), (c.seconds, cut.seconds), (c.values, cut.values),
                            (c.tokens, cut.tokens)):
            part.append(whole[n - 1] + w * (whole[n] - whole[n - 1]))
    return cut


def compare(better: Arm, worse: Arm, axis: str, min_effect: float, noise_sd: float | None,
            look: Look | None = None) -> Comparison:
    """better − worse on one axis: the paired interval over the seeds both ran (Welch's where fewer than
    two are shared), widened to ``look``'s group-sequential boundary (None: a plain 95% interval), whether
    it excludes 0 (``clear``) or lies within ±min_effect (``equivalent``), and the seeds per arm estimated
    to settle it (``verdicts.settled``)."""
    a, b = _by_seed(better, axis), _by_seed(worse, axis)
    d = stats.compare_arms(a, b) if a is not None and b is not None else \
        stats.diff_ci(better.scores[axis], worse.scores[axis])
    hw95 = _finite(d.half_width)
    hw = _finite(look.half_width(d)) if look is not None else hw95
    seeds = d.n if d.paired else min(len(better.scores[axis]), len(worse.scores[axis]))
    verdict = verdicts.classify(d.mean, hw, min_effect)
    sd = d.se * math.sqrt(d.n) if d.paired and math.isfinite(d.se) else noise_sd
    needed = stats.seeds_needed(d.mean, sd, min_effect, paired=d.paired,
                                nominal=look.final_nominal if look is not None else 0.05)
    if needed is not None and not verdicts.settled(verdict):
        # Unresolved with ``seeds`` seeds: more are needed, even where the pooled sd (which averages the
        # arms' spreads) says fewer would do.
        needed = max(needed, seeds + 1)
    return Comparison(better=better.name, worse=worse.name, better_value=better.value, worse_value=worse.value,
                      better_label=better.label, worse_label=worse.label, axis=axis, diff=d.mean, hw=hw,
                      clear=hw is not None and d.mean - hw > 0, equivalent=verdict is verdicts.Verdict.NO_DIFFERENCE,
                      seeds=seeds, seeds_needed=needed, paired=d.paired, sd=sd,
                      **(look.fields() if look is not None else {}), **({"hw95": hw95} if look is not None else {}))


def _by_seed(arm: Arm, axis: str) -> dict[int, float] | None:
    """An arm's scores on ``axis`` by seed; None (unpairable: Welch's) where a seed repeats within the arm."""
    scores = arm.scores[axis]
    if len(set(arm.seeds)) != len(arm.seeds) or len(arm.seeds) != len(scores):
        return None
    return dict(zip(arm.seeds, scores, strict=True))


def _arms(judging: Judging, trials: Sequence[TrialRun]) -> list[_Group]:
    """Trials pooled by configuration (same overrides = same arm, whatever iteration ran it), each arm
    named after the latest experiment that ran it."""
    groups: dict[tuple[str, int], _Group] = {}
    twins: dict[tuple[int, str], list[str]] = {}  # per iteration and configuration: its experiment names in order
    for t in sorted(trials, key=lambda t: t.iteration):
        # Arms with the same overrides in one iteration (an A/A check) stay apart: the n-th of them pools
        # with the n-th of another iteration.
        names = twins.setdefault((t.iteration, arm_key(t.overrides)), [])
        if t.experiment not in names:
            names.append(t.experiment)
        group = groups.setdefault((arm_key(t.overrides), names.index(t.experiment)), _Group(t.overrides))
        group.name, group.value = t.experiment, t.overrides.get(judging.knob)
        group.trials.append(t)
    return list(groups.values())


def evidence(judging: Judging, trials: Sequence[TrialRun], metric_note: str = "", switch: str = "") -> Evidence:
    """Pool ``trials`` by configuration and score them on ``judging.metric`` (as ``choose_metric`` chose it;
    ``switch``: why that is not the registered metric), on the knob's primary axis where every arm has the
    points for it (``window.judged_axis``)."""
    knob, metric, min_effect = judging.knob, judging.metric, judging.min_effect
    rows, budgets = _score(_arms(judging, trials), metric, judging.horizon, offered_axes(knob))
    twin_values = [repr(r.value) for r in rows]
    for r in rows:  # the knob's value names an arm unless two arms share it (then the experiment name too)
        shared = twin_values.count(repr(r.value)) > 1
        r.label = f"{r.name} ({knob}={r.value})" if shared else f"{knob}={r.value}"
    # An axis is measured when every usable run reached a budget on it (runs without train/episodes or
    # with a single timestamp have none).
    measured = [a for a in AXES if a == "step" or budgets[a] > 0]
    registered = primary_axis(knob)
    axis, why, moved, short = window.judged_axis(rows, measured, metric, budgets, registered)
    noise = {}
    for a in measured:
        sd, seeds = stats.pooled_sd([r.scores[a] for r in rows])
        noise[a] = Noise(sd=sd, seeds=seeds, arms=sum(1 for r in rows if len(r.scores[a]) >= 2))
    scored = sorted((r for r in rows if r.scored), key=lambda r: r.axes[axis].mean, reverse=True)
    out = Evidence(knob=knob, metric=metric, metric_note=metric_note, axis=axis, axis_why=why, budgets=budgets,
                   registered_axis=registered[0], switch=" ".join(s for s in (switch, moved) if s), short=short,
                   measured=measured, horizon=int(budgets["step"]), min_effect=min_effect, noise_floor=noise,
                   arms=rows, best=None, best_value=None, comparison=None, axes_compared={},
                   sweep=judging.shape == "sweep" or (judging.shape != "factorial" and len(rows) >= SWEEP_MIN))
    if scored:
        out.best, out.best_value = scored[0].name, scored[0].value
    if len(scored) > 1:
        out.comparison = compare(scored[0], scored[1], axis, min_effect, noise[axis].sd, judging.look)
        out.axes_compared = {a: compare(scored[0], scored[1], a, min_effect, noise[a].sd, judging.look)
                             for a in measured}
    return out


@dataclass(frozen=True)
class IterationRuns:
    """One iteration's experiments (name and arm settings, in plan order) and runs, the runs of the
    iterations before it (pooled into ``study``), and the previous iteration's best (plateau check)."""

    iteration: int
    experiments: Sequence[PlannedExperiment]
    trials: Sequence[TrialRun]
    previous_best: object = None  # the previous best value (None: no previous best)
    earlier: Sequence[TrialRun] = ()


def summarize(judging: Judging, runs_: IterationRuns) -> IterationSummary:
    """This iteration's table plus ``study``: the evidence pooled with the earlier iterations' trials.

    ``best``/``comparison`` are the study's (pooled) ones: the planner re-runs an unresolved pair until
    the pooled interval resolves it, and refines around the best of the whole study."""
    knob, iteration = judging.knob, runs_.iteration
    overrides = {e.name: e.settings for e in runs_.experiments}
    mine = [replace(t, overrides=overrides[t.experiment], iteration=iteration) for t in runs_.trials
            if t.experiment in overrides]
    pooled = [*runs_.earlier, *mine]
    metric, note = choose_metric(judging.metric, [Path(t.run_dir) for t in pooled if t.status in OK_STATUSES])
    switch = (f"Judged on `{metric}`, not the registered `{judging.metric}`: {note.split(': ', 1)[-1]}"
              if metric != judging.metric and judging.metric != TRAIN_METRIC else "")
    study = evidence(replace(judging, metric=metric), pooled, note, switch)
    if study.short and metric != TRAIN_METRIC:
        # Held-out rounds too sparse on every axis: the training reward has a point every step.
        switch = f"Judged on `{TRAIN_METRIC}`, not `{metric}`: {study.short}"
        metric, note = TRAIN_METRIC, (f"Verdicts use `{TRAIN_METRIC}` (the reward of the sampled training batch): "
                                      f"the held-out `{metric}` has too few rounds in every window.")
        study = evidence(replace(judging, metric=metric), pooled, note, switch)
    study.registered_metric = judging.metric
    judging = replace(judging, metric=metric)
    # This iteration alone is no registered look: its comparison is a plain 95% interval.
    here = evidence(replace(judging, look=None), mine, note, switch) if runs_.earlier else study
    order = {e.name: i for i, e in enumerate(runs_.experiments)}
    rows = sorted(here.arms, key=lambda r: order.get(r.name, len(order)))
    for name, settings in overrides.items():  # an experiment with no trial at all still shows (as a negative result)
        if not any(r.name == name for r in rows):
            rows.append(Arm(name=name, value=settings.get(knob), overrides=settings, statuses=[], aucs=[], finals=[],
                            runs=[], scores={a: [] for a in AXES}))
    summary = IterationSummary(iteration=iteration, knob=knob, metric=metric, horizon=here.horizon, experiments=rows,
                               best=study.best, best_value=study.best_value, comparison=study.comparison,
                               iteration_comparison=here.comparison, plateau=None, study=study)
    summary.plateau = _plateau(knob, [r for r in rows if r.scored], runs_.previous_best, judging.min_effect)
    return summary


def _plateau(knob: str, scored: list[Arm], previous_best: object, min_effect: float) -> str | None:
    """The incumbent re-ran on fresh seeds. Plateau only when the evidence says so: the whole 95% CI of
    (best challenger − incumbent) lies below min_effect. A wide CI is "unresolved", never a plateau."""
    if previous_best is None or len(scored) < 2:
        return None
    incumbent = next((r for r in scored if r.value == previous_best), None)
    if incumbent is None:
        return None
    # Twins of the incumbent (an A/A check) are no challengers: the knob did not change.
    challengers = sorted((r for r in scored if repr(r.value) != repr(incumbent.value)),
                         key=lambda r: r.auc.mean if r.auc else 0.0, reverse=True)
    gain = stats.diff_ci(challengers[0].aucs, incumbent.aucs) if challengers else None
    if gain is not None and math.isfinite(gain.high) and gain.high < min_effect:
        return (f"{knob}={challengers[0].value} did not beat {knob}={incumbent.value} by more "
                f"than {min_effect} in area under the curve: the knob has plateaued")
    return None


def backfill(history: list[IterationSummary], layout: StudyLayout, min_effect: float) -> list[IterationSummary]:
    """``history`` with the pooled evidence (``study``) in every summary.

    A state written before pooled evidence existed holds summaries without ``study``, and ``verdicts.verdict``
    would answer "No answer". Each such summary is summarized again from the runs on disk (run.json
    records, the overrides its experiments list), pooled with the iterations before it."""
    if all(s.study for s in history):
        return history
    records = runs.all_records(layout.runs_dir)
    out: list[IterationSummary] = []
    earlier: list[TrialRun] = []
    for s in history:
        knob = s.knob
        overrides = {e.name: e.overrides if "overrides" in e.model_fields_set else {knob: e.value}
                     for e in s.experiments}
        mine = [TrialRun(experiment=r.experiment, seed=r.seed, status=r.status,
                         run_dir=str(layout.run_dir(r.iteration, r.trial)))
                for r in records if r.iteration == s.iteration and r.experiment in overrides]
        if s.study:
            out.append(s)
        else:
            last = out[-1] if out else None
            experiments = [PlannedExperiment(name=name, overrides=o) for name, o in overrides.items()]
            new = summarize(Judging(knob, s.metric, s.horizon, min_effect),
                            IterationRuns(s.iteration, experiments, mine,
                                          last.best_value if last and last.best else None, earlier))
            out.append(IterationSummary.model_validate({**s.dump(), **new.without_runs().dump()}))
        earlier += [replace(t, overrides=overrides[t.experiment], iteration=s.iteration) for t in mine]
    return out
