"""analyze: per configuration mean ± 95% CI of the area under the reward curve and of the final
reward over seeds, a plot, plateau detection; logged to the iteration's MLflow parent run."""

from __future__ import annotations

import json
import shutil
from typing import Any

from researcher import analysis, plots, studyfiles
from researcher.context import StudyContext
from researcher.state import StudyState


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    iteration, framing = state["iteration"], state["framing"]
    plan = studyfiles.read_plan(ctx.layout)["iterations"][str(iteration)]
    history = [s for s in state.get("iterations", []) if s["iteration"] != iteration]
    previous = None
    if history and history[-1].get("best") is not None:
        previous = {"name": history[-1]["best"], "value": history[-1]["best_value"]}
    summary = analysis.summarize(iteration, framing["knob"], framing["metric"], plan["steps_per_run"],
                                 plan["experiments"], list(state["trials"]), state["options"]["min_effect"], previous)
    plot = plots.reward_curves(summary, ctx.layout.plots_dir / f"iteration-{iteration}.png",
                               f"{state['study_id']} · iteration {iteration} · {framing['knob']}")
    figure = ctx.layout.study_dir / "figures" / plot.name
    figure.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plot, figure)
    summary["plot"] = f"figures/{plot.name}"
    for row in summary["experiments"]:
        row.pop("runs", None)  # run dirs stay in run.json; the state keeps numbers only
    analysis_file = ctx.layout.artifacts_dir / f"analysis-{iteration}.json"
    analysis_file.write_text(json.dumps(summary, indent=2, default=str))

    lines = []
    for row in summary["experiments"]:
        if "auc" in row:
            lines.append(f"{row['name']}: AUC {_fmt(row['auc'])}, final {_fmt(row['final'])} "
                         f"({len(row['aucs'])}/{len(row['statuses'])} runs usable)")
        else:
            lines.append(f"{row['name']}: no usable run ({', '.join(row['statuses']) or 'none launched'}) — negative "
                         "result, nothing measured")
    comparison = summary["comparison"]
    if comparison:
        lines.append(f"{comparison['better']} − {comparison['worse']} = {comparison['diff']:+.3f}"
                     + (f" ± {comparison['hw']:.3f}" if comparison["hw"] is not None else "")
                     + (" (clear)" if comparison["clear"] else " (CI includes 0: not a clear difference)"))
    if summary["plateau"]:
        lines.append(summary["plateau"])
    studyfiles.log(ctx.layout, f"Iteration {iteration} analysed: " + "; ".join(lines) + ".")

    parent = state.get("mlflow_parent_run")
    if parent:
        metrics = {}
        for row in summary["experiments"]:
            if "auc" in row:
                metrics[f"analysis/auc_mean/{row['name']}"] = row["auc"]["mean"]
                metrics[f"analysis/final_mean/{row['name']}"] = row["final"]["mean"]
        ctx.tracker.log_values(parent, metrics, step=iteration)
        ctx.tracker.log_files(parent, [analysis_file, plot, ctx.layout.log_md], "analysis")
        if ctx.layout.llm_calls_dir.is_dir():
            ctx.tracker.log_files(parent, [ctx.layout.llm_calls_dir], "planner_calls")
        ctx.tracker.end(parent, "FINISHED")
    ctx.say("analyzed", iteration=iteration, best=summary["best"], lines=lines)
    return {"iterations": history + [summary], "phase": "deciding"}


def _fmt(cell: dict[str, Any]) -> str:
    return f"{cell['mean']:.3f}" + (f" ± {cell['hw']:.3f}" if cell.get("hw") is not None else f" (n={cell['n']})")
