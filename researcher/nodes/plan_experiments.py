"""plan_experiments: write this iteration's hypotheses and experiments down before anything runs.

The asked question is the tested question: whatever planner answers, its plan is checked against
the topic's own reading (``topic.parse``). A plan that drops a value the topic names, ignores a
value it fixes, or answers "how does X affect Y" with fewer than 4 values is re-asked once with
the precise complaint; a second miss is refused with a clear error and nothing is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from researcher import budget, catalog, studyfiles
from researcher.context import StudyContext
from researcher.layout import run_key
from researcher.planner import topic
from researcher.planner.schema import Framing, Plan, Planner
from researcher.planner.usage import LLMUsage, add_usage, new_usage
from researcher.state import StudyState, Trial

SEED_STRIDE = 1000  # iteration i uses seeds i*1000 + k: fresh seeds for every iteration


@dataclass
class CheckedPlan:
    plan: Plan
    usage: LLMUsage
    complaints: list[str]  # what was wrong with each refused answer, in order
    ok: bool               # the final plan tests the topic's question


def ask_checked(planner: Planner, framing: Framing, context: dict[str, Any],
                question: topic.TopicQuestion) -> CheckedPlan:
    """Ask for a plan; when it does not test ``question``, ask once more with the complaint (and the
    refused plan) in the context, and report whether the second answer passes."""
    usage = new_usage()
    complaints: list[str] = []
    tested = list(context.get("tested_values", []))
    room = max(int(context.get("runs_left", 0)) // max(int(context.get("seeds_per_experiment", 1)), 1), 1)
    asked = dict(context)
    for _ in range(2):
        reply = planner.plan(framing, asked)
        usage = add_usage(usage, reply.usage)
        complaint = topic.plan_complaint(question, framing.knob, [e.overrides for e in reply.value.experiments],
                                         tested, room)
        if complaint is None:
            return CheckedPlan(reply.value, usage, complaints, True)
        complaints.append(complaint)
        asked = {**context, "complaint": f"Your previous plan was refused: {complaint} Fix exactly this.",
                 "refused_plan": reply.value.model_dump()}
    return CheckedPlan(reply.value, usage, complaints, False)


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    framing = Framing.model_validate(state["framing"])
    options = state["options"]
    iteration = state.get("iteration", 0) + 1
    history = state.get("iterations", [])
    used_names = {e["name"] for s in history for e in s["experiments"]}
    tested = [e["value"] for s in history for e in s["experiments"]]
    best = history[-1]["best_value"] if history else None
    question = topic.parse(state["topic"])
    example = catalog.examples(ctx.settings.examples_root).get(framing.task)
    task_config = studyfiles.server_config(example.config, {}) if example else {}
    context = {"iteration": iteration, "topic": state["topic"], "named": question.summary(),
               "seeds_per_experiment": options["seeds"], "steps_per_run": options["steps_per_run"],
               "min_effect": options["min_effect"], "task_config": task_config, "tested_values": tested,
               "best_value": best, "time_left_s": round(budget.time_left(state, ctx.clock())),
               "runs_left": budget.runs_left(state),
               "history": [{**{k: s[k] for k in ("iteration", "best", "best_value", "comparison", "plateau")},
                            "values": {e["name"]: e["value"] for e in s["experiments"]}} for s in history],
               "knob_ladder": list(catalog.knob(framing.knob).ladder)}
    checked = ask_checked(ctx.planner, framing, context, question)
    plan, usage = checked.plan, add_usage(state.get("llm") or new_usage(), checked.usage)
    for complaint in checked.complaints:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the planner's plan was refused: {complaint}")
    if not checked.ok:
        error = (f"The {ctx.planner.name} planner's plan does not test the asked question, even after a repair "
                 f"round: {checked.complaints[-1]}")
        return {"phase": "failed", "error": error, "llm": usage}

    experiments, seen, notes = [], set(used_names), []
    for exp in plan.experiments:
        if exp.name in seen:
            notes.append(f"{exp.name} already ran; not repeated")
            continue  # never repeat an experiment that already ran
        seen.add(exp.name)
        experiments.append(exp)
    seeds = options["seeds"]
    fit = budget.runs_left(state) // seeds
    if fit < len(experiments):
        dropped = experiments[fit:]
        notes.append(f"the run budget ({budget.runs_left(state)} runs left, {seeds} seeds each) fits {fit} of "
                     f"{len(experiments)} configurations: not run " + ", ".join(
                         f"{e.name} {json.dumps(e.overrides)}" for e in dropped))
    experiments = experiments[:fit]
    if len(experiments) < min(2, len(plan.experiments)):
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the run budget does not fit a comparison "
                                   f"({len(experiments)} configuration(s)); concluding.")
        return {"phase": "reporting", "llm": usage, "decision": {"action": "conclude", "reason": "run budget spent"}}

    assumptions = _unique([*question.assumptions, *plan.assumptions, *notes])
    studyfiles.write_plan(ctx.layout, iteration, {"rationale": plan.rationale, "shape": plan.shape,
                                                  "stage": plan.stage, "assumptions": assumptions,
                                                  "question": {k: v for k, v in question.summary().items()
                                                               if k != "assumptions"},
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
    studyfiles.log(ctx.layout, f"Iteration {iteration} planned ({plan.shape}, {plan.stage}; {plan.rationale}) "
                               f"Hypotheses, written before running: {hypotheses} Experiments: "
                               + ", ".join(f"{e.name} {json.dumps(e.overrides)}" for e in experiments)
                               + f"; {seeds} seeds each, {options['steps_per_run']} steps per run."
                               + (" Assumed: " + "; ".join(assumptions) + "." if assumptions else ""))
    parent = ctx.tracker.start_parent(state["study_id"], iteration, {"researcher.knob": framing.knob,
                                                                     "researcher.task": framing.task})
    ctx.tracker.log_params(parent, {"knob": framing.knob, "task": framing.task, "metric": framing.metric,
                                    "seeds": seeds, "steps_per_run": options["steps_per_run"],
                                    "shape": plan.shape, "stage": plan.stage,
                                    "experiments": ",".join(e.name for e in experiments)})
    ctx.tracker.log_files(parent, [ctx.layout.plan_json])
    ctx.say("planned", iteration=iteration, experiments=[e.name for e in experiments], seeds=seeds)
    return {"iteration": iteration, "experiments": [e.name for e in experiments], "trials": trials,
            "validation": {"attempts": 0, "ok": False, "error": None}, "mlflow_parent_run": parent,
            "phase": "writing", "llm": usage}


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))

