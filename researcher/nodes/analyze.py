"""analyze: the evidence of this iteration and of the whole study (seeds of the same configuration
pooled across iterations): per configuration mean ± 95% CI of the area under the reward curve on three
axes (per step, per episode, per second) and of the final reward, the noise floor, plots (reward
curves, the three axes, a dose-response curve for sweeps), plateau detection; logged to the
iteration's MLflow parent run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from researcher import analysis, factorial, plots, runs, studyfiles
from researcher.context import StudyContext
from researcher.layout import StudyLayout
from researcher.state import StudyState


def earlier_trials(layout: StudyLayout, iteration: int) -> list[dict[str, Any]]:
    """Runs of the iterations before ``iteration`` as trials with their configuration (from plan.json)."""
    plan = studyfiles.read_plan(layout).get("iterations", {})
    found = []
    for record in runs.all_records(layout.runs_dir):
        if record.iteration >= iteration:
            continue
        planned = plan.get(str(record.iteration), {}).get("experiments", [])
        exp = next((e for e in planned if e["name"] == record.experiment), None)
        if exp is not None:
            found.append({"experiment": record.experiment, "overrides": factorial.arm_settings(exp),
                          "iteration": record.iteration,
                          "seed": record.seed, "status": record.status,
                          "run_dir": str(layout.run_dir(record.iteration, record.trial))})
    return found


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    iteration, framing = state["iteration"], state["framing"]
    plan = studyfiles.read_plan(ctx.layout)["iterations"][str(iteration)]
    history = [s for s in state.get("iterations", []) if s["iteration"] != iteration]
    previous = None
    if history and history[-1].get("best") is not None:
        previous = {"name": history[-1]["best"], "value": history[-1]["best_value"]}
    # An arm is its server overrides and its client factor levels (factorial designs vary both).
    arms = [{**e, "overrides": factorial.arm_settings(e)} for e in plan["experiments"]]
    summary = analysis.summarize(iteration, framing["knob"], framing["metric"], plan["steps_per_run"],
                                 arms, list(state["trials"]), state["options"]["min_effect"], previous,
                                 earlier_trials(ctx.layout, iteration), plan.get("shape"))
    study, title = summary["study"], f"{state['study_id']} · {framing['knob']}"
    study["effects"] = factorial.effects(study, framing.get("factors") or [])  # [] unless a 2-level factorial
    summary["plot"] = _figure(ctx, plots.reward_curves(summary, ctx.layout.plots_dir / f"iteration-{iteration}.png",
                                                       f"{title} · iteration {iteration}"))
    study["plots"] = {"axes": _figure(ctx, plots.axes_curves(study, ctx.layout.plots_dir / "axes.png",
                                                             f"{title} · every iteration, three axes"))}
    if study["sweep"] and sum(1 for r in study["arms"] if "axes" in r) >= 2:
        study["plots"]["curve"] = _figure(ctx, plots.dose_response(study, ctx.layout.plots_dir / "dose-response.png",
                                                                   f"{title} · dose-response"))
    for row in [*summary["experiments"], *study["arms"]]:
        row.pop("runs", None)  # run dirs stay in run.json; the state keeps numbers only
    analysis_file = ctx.layout.artifacts_dir / f"analysis-{iteration}.json"
    analysis_file.write_text(json.dumps(summary, indent=2, default=str))

    # Whole-study lines on the verdict's axis and metric, highest first: the first names ``best``.
    axis, measure = study["axis"], f"AUC {analysis.AXIS_TEXT[study['axis']]} of `{study['metric']}`"
    lines = []
    for row in sorted((r for r in study["arms"] if "axes" in r), key=lambda r: -r["axes"][axis]["mean"]):
        lines.append(f"{row['name']} ({framing['knob']}={row['value']}): {measure} {_fmt(row['axes'][axis])}, final "
                     f"{_fmt(row['final'])} ({len(row['aucs'])}/{len(row['statuses'])} runs usable, iteration(s) "
                     f"{', '.join(map(str, row['iterations']))})")
    for row in summary["experiments"]:
        if "auc" not in row:
            statuses = ", ".join(row["statuses"]) or "none launched"
            lines.append(f"{row['name']}: no usable run in iteration {iteration} ({statuses}) — negative result, "
                         "nothing measured")
    comparison = summary["comparison"]
    if comparison:
        lines.append(f"whole study ({analysis.AXIS_TEXT[comparison['axis']]}, `{summary['metric']}`): "
                     f"{comparison['better']} − {comparison['worse']} = {comparison['diff']:+.3f}"
                     + (f" ± {comparison['hw']:.3f}" if comparison["hw"] is not None else "")
                     + (" (clear)" if comparison["clear"] else " (CI includes 0: not a clear difference)"))
    if summary["plateau"]:
        lines.append(summary["plateau"])
    studyfiles.log(ctx.layout, f"Iteration {iteration} analysed: " + "; ".join(lines) + ".")

    parent = state.get("mlflow_parent_run")
    if parent:
        values = {}
        for row in summary["experiments"]:
            if "auc" in row:
                values[f"analysis/auc_mean/{row['name']}"] = row["auc"]["mean"]
                values[f"analysis/final_mean/{row['name']}"] = row["final"]["mean"]
        values |= mlflow_values(study) | factorial.mlflow_values(study)
        # One table artifact, not a one-point metric each (MLflow charted ~30 of them on the parent run).
        ctx.tracker.log_table(parent, evidence_table(values), "analysis/evidence.json")
        ctx.tracker.set_tags(parent, evidence_tags(study))
        # Under figures/, as report.md (logged to the same run) references them, so MLflow renders them.
        figures = [ctx.layout.study_dir / p for p in [summary["plot"], *study["plots"].values()]]
        ctx.tracker.log_files(parent, figures, "figures")
        ctx.tracker.log_files(parent, [analysis_file, ctx.layout.log_md], "analysis")
        if ctx.layout.llm_calls_dir.is_dir():
            ctx.tracker.log_files(parent, [ctx.layout.llm_calls_dir], "planner_calls")
        ctx.tracker.end(parent, "FINISHED")
    ctx.say("analyzed", iteration=iteration, best=summary["best"], lines=lines)
    return {"iterations": history + [summary], "phase": "deciding"}


def _fmt(cell: dict[str, Any]) -> str:
    return f"{cell['mean']:.3f}" + (f" ± {cell['hw']:.3f}" if cell.get("hw") is not None else f" (n={cell['n']})")


def _figure(ctx: StudyContext, plot: Path) -> str:
    """Copy a plot into the study folder's figures/ (beside report.md) and return its relative path."""
    figure = ctx.layout.study_dir / "figures" / plot.name
    figure.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plot, figure)
    return f"figures/{plot.name}"


def mlflow_values(study: dict[str, Any]) -> dict[str, float]:
    """The whole study's evidence as parent-run metrics: each configuration's AUC on the three axes, the
    noise floor (and the seeds it rests on) per axis, the minimum effect and the pooled comparison."""
    values: dict[str, float] = {"analysis/min_effect": float(study["min_effect"])}
    for axis, noise in study["noise_floor"].items():
        values[f"analysis/noise_floor_seeds/{axis}"] = float(noise["seeds"])
        if noise["sd"] is not None:
            values[f"analysis/noise_floor/{axis}"] = noise["sd"]
    for row in study["arms"]:
        for axis, cell in (row.get("axes") or {}).items():
            values[f"analysis/auc_{axis}/{row['name']}"] = cell["mean"]
            if cell["hw"] is not None:
                values[f"analysis/auc_{axis}_ci/{row['name']}"] = cell["hw"]
    for axis, c in (study.get("axes_compared") or {}).items():
        values[f"analysis/diff_{axis}"] = c["diff"]
        if c["hw"] is not None:
            values[f"analysis/diff_{axis}_ci"] = c["hw"]
    return values


def evidence_table(values: dict[str, float]) -> dict[str, list[Any]]:
    """``analysis/<quantity>/<subject>`` values as the columns of one table (quantity, subject, value)."""
    table: dict[str, list[Any]] = {"quantity": [], "subject": [], "value": []}
    for key, value in values.items():
        quantity, _, subject = key.removeprefix("analysis/").partition("/")
        table["quantity"].append(quantity)
        table["subject"].append(subject)
        table["value"].append(round(float(value), 6))
    return table


def evidence_tags(study: dict[str, Any]) -> dict[str, str]:
    """The parent run's headline: the metric and axis the verdict used, and a best configuration
    only where the evidence resolved one (else the leader, with what the evidence says)."""
    kind = _kind(study["comparison"])
    tags = {"researcher.metric": study["metric"], "researcher.primary_axis": study["axis"],
            "researcher.evidence": kind, "researcher.leader": str(study["best"])}
    if study.get("metric_note"):
        tags["researcher.metric_note"] = study["metric_note"][:500]
    tags["researcher.best"] = str(study["best"]) if kind == "resolved" else \
        f"none ({'no comparison' if kind == 'none' else kind})"
    return tags


def _kind(c: dict[str, Any] | None) -> str:
    if c is None:
        return "none"
    # A difference inside ±min_effect is no meaningful one even when its CI excludes 0 (as in the Answer).
    return "no meaningful difference" if c["equivalent"] else ("resolved" if c["clear"] else "inconclusive")
