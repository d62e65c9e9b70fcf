"""analyze: the evidence of this iteration and of the whole study (seeds of the same configuration
pooled across iterations): per configuration mean ± 95% CI of the area under the reward curve on three
axes (per step, per episode, per second) and of the final reward, the noise floor, plots (reward
curves, the three axes, a dose-response curve for sweeps), plateau detection; logged to the
iteration's MLflow parent run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from researcher.evidence import analysis, factorial, looks, plots, run_table, sizing
from researcher.findings import verdicts
from researcher.findings.records import Cell, Evidence, IterationSummary, PlanFile
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, framed, study_options, summaries
from swarm.atomic import write_atomic


def _pilot_alone(state: StudyState, ctx: StudyContext, plan_file: PlanFile) -> None:
    """A pilot after which the budget runs no further look is the study's only look: it spends the whole
    alpha instead of none, so a short budget can still decide. Whether another look fits depends on the
    time, runs and iterations left and the measured seconds a run takes (the test ``decide`` applies),
    never on the data, so the study's false-positive rate stays at alpha on either path."""
    iteration = state["iteration"]
    pilot = plan_file.iteration(iteration).look
    if pilot is None or pilot.fraction is not None or plan_file.design is None:
        return
    room = sizing.room_now(state, ctx.clock())
    if room.seeds_per_look(1) >= 1 and iteration < state["budget"]["max_iterations"]:
        return
    studyfiles.amend_look(ctx.layout, iteration, pilot.model_copy(update={"fraction": 1.0}))
    studyfiles.log(ctx.layout, f"The budget runs no look after the pilot ({budget.runs_left(state)} runs and "
                               f"{room.time_left_s:.0f} s left, a run takes about {room.run_s:.0f} s): the pilot is "
                               "the study's only look and spends the whole alpha.")


def analyze(state: StudyState, ctx: StudyContext) -> StudyState:
    iteration, framing = state["iteration"], framed(state)
    _pilot_alone(state, ctx, studyfiles.read_plan(ctx.layout))
    plan_file = studyfiles.read_plan(ctx.layout)
    plan = plan_file.iteration(iteration)
    # The registered look this analysis is, after those before it (plan.json holds each before its runs).
    look = looks.current(plan_file.design, [lk for i in range(1, iteration + 1)
                                            if (lk := plan_file.iteration(i).look) is not None])
    history = [s for s in summaries(state) if s.iteration != iteration]
    previous = history[-1].best_value if history and history[-1].best is not None else None
    # The verdict's metric is the one the hypotheses registered before running: the held-out reward or the
    # framing's metric (a free-text metric an LLM wrote into a hypothesis names no curve: the framing's then).
    registered = next((h.metric for h in plan.hypotheses if h.metric in (analysis.EVAL_METRIC, framing.metric)),
                      framing.metric)
    judging = analysis.Judging(framing.knob, registered, plan.steps_per_run, study_options(state).min_effect,
                               plan.shape, look)
    trials = [analysis.TrialRun(experiment=t["experiment"], run_dir=t["run_dir"], status=t["status"], seed=t["seed"])
              for t in state["trials"]]
    summary = analysis.summarize(judging, analysis.IterationRuns(iteration, plan.experiments, trials, previous,
                                                                 run_table.planned_trials(ctx.layout, iteration)))
    study = summary.study
    assert study is not None  # summarize always pools
    title = f"{state['study_id']} · {framing.knob}"
    study.effects = factorial.effects(study, framing.factors)  # [] unless a 2-level factorial
    summary.plot = _figure(ctx, plots.reward_curves(summary, ctx.layout.plots_dir / f"iteration-{iteration}.png",
                                                    f"{title} · iteration {iteration}"))
    study.plots = {"axes": _figure(ctx, plots.axes_curves(study, ctx.layout.plots_dir / "axes.png",
                                                          f"{title} · every iteration, three axes"))}
    if study.sweep and sum(1 for r in study.arms if r.scored) >= 2:
        study.plots["curve"] = _figure(ctx, plots.dose_response(study, ctx.layout.plots_dir / "dose-response.png",
                                                                f"{title} · dose-response"))
    looked = plots.looks([*history, summary], ctx.layout.plots_dir / "looks.png", f"{title} · each look's z "
                         "against its boundary")
    if looked is not None:
        study.plots["looks"] = _figure(ctx, looked)
    summary = summary.without_runs()  # run dirs stay in run.json; the state keeps numbers only
    analysis_file = ctx.layout.artifacts_dir / f"analysis-{iteration}.json"
    write_atomic(analysis_file, json.dumps(summary.dump(), indent=2, default=str))
    lines = _lines(summary, framing.knob)
    studyfiles.log(ctx.layout, f"Iteration {iteration} analysed: " + "; ".join(lines) + ".")
    parent = state.get("mlflow_parent_run")
    if parent:
        _log_parent(ctx, parent, summary, analysis_file)
    # The metric judged (registered or switched to), charted on the axis judged.
    ctx.tracker.save_review_view(state["study_id"], study.metric, study.axis)
    ctx.say("analyzed", iteration=iteration, best=summary.best, lines=lines)
    return {"iterations": [s.dump() for s in [*history, summary]], "phase": "deciding"}


def _lines(summary: IterationSummary, knob: str) -> list[str]:
    """The LOG.md lines: the whole study on the verdict's axis and metric, highest first (the first
    names ``best``), this iteration's negative results, the pooled comparison and a plateau."""
    study = summary.study
    assert study is not None
    axis, measure = study.axis, f"AUC {analysis.AXIS_TEXT[study.axis]} of `{study.metric}`"
    lines = []
    for row in sorted((r for r in study.arms if r.scored), key=lambda r: -r.axes[axis].mean):
        lines.append(f"{row.name} ({knob}={row.value}): {measure} {_fmt(row.axes[axis])}, final "
                     f"{_fmt(row.final)} ({len(row.aucs)}/{len(row.statuses)} runs usable, iteration(s) "
                     f"{', '.join(map(str, row.iterations))})")
    for row in summary.experiments:
        if not row.scored:
            statuses = ", ".join(row.statuses) or "none launched"
            lines.append(f"{row.name}: no usable run in iteration {summary.iteration} ({statuses}) — negative result, "
                         "nothing measured")
    comparison = summary.comparison
    if comparison:
        lines.append(f"whole study ({analysis.AXIS_TEXT[comparison.axis]}, `{summary.metric}`): "
                     f"{comparison.better} − {comparison.worse} = {comparison.diff:+.3f}"
                     + (f" ± {comparison.hw:.3f}" if comparison.hw is not None else "")
                     + f" ({verdicts.classify(comparison.diff, comparison.hw, study.min_effect).lower()})")
    if summary.plateau:
        lines.append(summary.plateau)
    return lines


def _log_parent(ctx: StudyContext, parent: str, summary: IterationSummary, analysis_file: Path) -> None:
    """The iteration's evidence, figures and analysis on its MLflow parent run, which then ends."""
    study = summary.study
    assert study is not None
    values = {}
    for row in summary.experiments:
        if row.auc is not None and row.final is not None:
            values[f"analysis/auc_mean/{row.name}"] = row.auc.mean
            values[f"analysis/final_mean/{row.name}"] = row.final.mean
    values |= mlflow_values(study) | factorial.mlflow_values(study)
    # One table artifact, not a one-point metric each (MLflow charted ~30 of them on the parent run).
    ctx.tracker.log_table(parent, evidence_table(values), "analysis/evidence.json")
    ctx.tracker.set_tags(parent, evidence_tags(study))
    # Under figures/, as report.md (logged to the same run) references them, so MLflow renders them.
    plotted = [ctx.layout.study_dir / p for p in [summary.plot or "", *study.plots.values()] if p]
    figures = [*plotted, *(p.with_suffix(".csv") for p in plotted)]
    ctx.tracker.log_files(parent, figures, "figures")
    ctx.tracker.log_files(parent, [analysis_file, ctx.layout.log_md], "analysis")
    if ctx.layout.llm_calls_dir.is_dir():
        ctx.tracker.log_files(parent, [ctx.layout.llm_calls_dir], "planner_calls")
    ctx.tracker.end(parent, "FINISHED")


def _fmt(cell: Cell | None) -> str:
    assert cell is not None  # scored arms have every cell
    return f"{cell.mean:.3f}" + (f" ± {cell.hw:.3f}" if cell.hw is not None else f" (n={cell.n})")


def _figure(ctx: StudyContext, plot: Path) -> str:
    """Copy a plot and its data (``<name>.csv``) into the study folder's figures/ (beside report.md) and
    return the plot's relative path."""
    figure = ctx.layout.study_dir / "figures" / plot.name
    figure.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plot, figure)
    shutil.copyfile(plot.with_suffix(".csv"), figure.with_suffix(".csv"))
    return f"figures/{plot.name}"


def mlflow_values(study: Evidence) -> dict[str, float]:
    """The whole study's evidence as parent-run metrics: each configuration's AUC on the three axes, the
    noise floor (and the seeds it rests on) per axis, the minimum effect and the pooled comparison."""
    values: dict[str, float] = {"analysis/min_effect": float(study.min_effect)}
    for axis, noise in study.noise_floor.items():
        values[f"analysis/noise_floor_seeds/{axis}"] = float(noise.seeds)
        if noise.sd is not None:
            values[f"analysis/noise_floor/{axis}"] = noise.sd
    for row in study.arms:
        for axis, cell in row.axes.items():
            values[f"analysis/auc_{axis}/{row.name}"] = cell.mean
            if cell.hw is not None:
                values[f"analysis/auc_{axis}_ci/{row.name}"] = cell.hw
    for axis, c in study.axes_compared.items():
        values[f"analysis/diff_{axis}"] = c.diff
        if c.hw is not None:
            values[f"analysis/diff_{axis}_ci"] = c.hw
    return values


def evidence_table(values: dict[str, float]) -> dict[str, list[str | float]]:
    """``analysis/<quantity>/<subject>`` values as the columns of one table (quantity, subject, value)."""
    table: dict[str, list[str | float]] = {"quantity": [], "subject": [], "value": []}
    for key, value in values.items():
        quantity, _, subject = key.removeprefix("analysis/").partition("/")
        table["quantity"].append(quantity)
        table["subject"].append(subject)
        table["value"].append(round(float(value), 6))
    return table


def evidence_tags(study: Evidence) -> dict[str, str]:
    """The parent run's headline: the metric and axis the verdict used, and a best configuration
    only where the evidence resolved one (else the leader, with what the evidence says)."""
    kind = _kind(study)
    tags = {"researcher.metric": study.metric, "researcher.primary_axis": study.axis,
            "researcher.evidence": kind, "researcher.leader": str(study.best)}
    if study.metric_note:
        tags["researcher.metric_note"] = study.metric_note[:500]
    tags["researcher.best"] = str(study.best) if kind == "resolved" else \
        f"none ({'no comparison' if kind == 'none' else kind})"
    return tags


def _kind(study: Evidence) -> str:
    """"resolved" only where the Answer claims a direction (``rules``); else the class, lower case."""
    c = study.comparison
    if c is None:
        return "none"
    verdict = verdicts.classify(c.diff, c.hw, study.min_effect)
    return "resolved" if verdicts.resolved(verdict) and not study.short else verdict.lower()
