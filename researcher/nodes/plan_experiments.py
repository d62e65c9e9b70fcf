"""plan_experiments: write this iteration's hypotheses and experiments down before anything runs."""

from __future__ import annotations

import json
from typing import Any

from researcher import budget, catalog, studyfiles
from researcher.context import StudyContext
from researcher.layout import run_key
from researcher.planner.schema import Framing
from researcher.planner.usage import add_usage, new_usage
from researcher.state import StudyState, Trial

SEED_STRIDE = 1000  # iteration i uses seeds i*1000 + k: fresh seeds for every iteration


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    framing = Framing.model_validate(state["framing"])
    options = state["options"]
    iteration = state.get("iteration", 0) + 1
    history = state.get("iterations", [])
    used_names = {e["name"] for s in history for e in s["experiments"]}
    tested = [e["value"] for s in history for e in s["experiments"]]
    best = history[-1]["best_value"] if history else None
    context = {"iteration": iteration, "seeds_per_experiment": options["seeds"],
               "steps_per_run": options["steps_per_run"], "tested_values": tested, "best_value": best,
               "time_left_s": round(budget.time_left(state, ctx.clock())), "runs_left": budget.runs_left(state),
               "history": [{k: s[k] for k in ("iteration", "best", "best_value", "comparison", "plateau")}
                           for s in history],
               "knob_ladder": list(catalog.knob(framing.knob).ladder)}
    reply = ctx.planner.plan(framing, context)
    plan, usage = reply.value, add_usage(state.get("llm") or new_usage(), reply.usage)

    experiments, seen = [], set(used_names)
    for exp in plan.experiments:
        if exp.name in seen:
            continue  # never repeat an experiment that already ran
        seen.add(exp.name)
        experiments.append(exp)
    seeds = options["seeds"]
    fit = budget.runs_left(state) // seeds
    experiments = experiments[:fit]
    if len(experiments) < 1:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: no new experiment fits the run budget; concluding.")
        return {"phase": "reporting", "llm": usage, "decision": {"action": "conclude", "reason": "run budget spent"}}

    studyfiles.write_plan(ctx.layout, iteration, {"rationale": plan.rationale,
                                                  "hypotheses": [h.model_dump() for h in plan.hypotheses],
                                                  "experiments": [e.model_dump() for e in experiments],
                                                  "seeds": [iteration * SEED_STRIDE + k for k in range(seeds)],
                                                  "steps_per_run": options["steps_per_run"]},
                          framing.model_dump())
    trials: list[Trial] = []
    # Seed-major order: every configuration gets its first seed before any gets its second.
    for k in range(seeds):
        for exp in experiments:
            index = len(trials)
            trials.append({"trial": index, "key": run_key(state["study_id"], iteration, index),
                           "experiment": exp.name, "seed": iteration * SEED_STRIDE + k,
                           "run_dir": str(ctx.layout.run_dir(iteration, index)), "status": "pending"})
    hypotheses = "; ".join(f"{h.id}: {h.statement} Expected: {h.expected_effect}" for h in plan.hypotheses)
    studyfiles.log(ctx.layout, f"Iteration {iteration} planned ({plan.rationale}) Hypotheses, written before "
                               f"running: {hypotheses} Experiments: "
                               + ", ".join(f"{e.name} {json.dumps(e.overrides)}" for e in experiments)
                               + f"; {seeds} seeds each, {options['steps_per_run']} steps per run.")
    parent = ctx.tracker.start_parent(state["study_id"], iteration, {"researcher.knob": framing.knob,
                                                                     "researcher.task": framing.task})
    ctx.tracker.log_params(parent, {"knob": framing.knob, "task": framing.task, "metric": framing.metric,
                                    "seeds": seeds, "steps_per_run": options["steps_per_run"],
                                    "experiments": ",".join(e.name for e in experiments)})
    ctx.tracker.log_files(parent, [ctx.layout.plan_json])
    ctx.say("planned", iteration=iteration, experiments=[e.name for e in experiments], seeds=seeds)
    return {"iteration": iteration, "experiments": [e.name for e in experiments], "trials": trials,
            "validation": {"attempts": 0, "ok": False, "error": None}, "mlflow_parent_run": parent,
            "phase": "writing", "llm": usage}
