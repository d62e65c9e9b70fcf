"""write_client: write each experiment's client.py and config.toml (or repair the client after a
failed validation, showing the planner the error).

Every experiment folder is self-contained (``swarm run experiments/<name>/client.py`` reproduces a
run by hand): its config.toml is the base example's config with the experiment's overrides, and its
client.py is the planner's client with the experiment's client factor levels written into the
``FACTORS`` assignment (``study.files.set_factors``). A client that cannot take the levels (no FACTORS
dict, an unknown factor) goes back to the planner's repair step once with the precise message. A
later iteration whose plan records no ``code_change`` reuses the previous iteration's client without
asking the planner; one that does gets the previous client as its starting point.

A plan whose overrides hold a key that is not a config key fails the study before any file is
written or any planner call is made (validate passes a failed study on to the report)."""

from __future__ import annotations

from researcher.findings.records import IterationPlan, JsonObject, PlanFile
from researcher.planner import catalog
from researcher.runs import preflight
from researcher.session.context import StudyContext
from researcher.study import budget, coupling
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, Validation, framed, study_options
from researcher.types.design import Framing
from researcher.types.usage import add_usage, new_usage


def write(state: StudyState, ctx: StudyContext) -> StudyState:
    framing = framed(state)
    iteration = state["iteration"]
    example = catalog.examples(ctx.settings.examples_root).get(framing.example)
    if example is None:
        error = f"the example study {framing.example!r} the framing starts from is missing"
        studyfiles.log(ctx.layout, f"Iteration {iteration}: {error}.")
        return {"phase": "failed", "error": error}
    plans = studyfiles.read_plan(ctx.layout)
    plan = plans.iteration(iteration)
    try:
        baseline = study_options(state).baseline or {}  # a campaign's settled findings: the arms' own win
        planned = {exp.name: studyfiles.server_config(example.config, {**baseline, **exp.overrides})
                   for exp in plan.experiments}
        # Existing servers (--server) keep the noise mode they were started with.
        configs = coupling.couple(planned, study_options(state).couple and not ctx.settings.servers)
    except ValueError as exc:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the plan is unusable: {exc}")
        return {"phase": "failed", "error": f"the plan of iteration {iteration} is unusable: {exc}"}
    validation = Validation(**(state.get("validation") or {"attempts": 0, "ok": False, "error": None}))
    previous = _previous_client(ctx, plans, iteration)
    start = previous or example.client.read_text()  # the code the planner starts from
    context = _context(state, framing, plan, validation, bool(previous), ctx.clock())
    first = ctx.layout.experiment_dir(plan.experiments[0].name) / "client.py"
    usage = state.get("llm") or new_usage()
    failed_with = validation.get("error")
    if failed_with and first.is_file():
        reply = ctx.planner.repair_client(first.read_text(), failed_with, start, context)
        code, usage = reply.value.code, add_usage(usage, reply.usage)
        what = f"Repaired the client after validation attempt {validation['attempts']} ({reply.value.notes})."
    elif previous and not plan.code_change:
        code = previous
        what = f"Reused the client of iteration {iteration - 1} (the plan changes no code)."
    else:
        reply = ctx.planner.write_client(framing, start, [e.dump() for e in plan.experiments], context)
        code, usage = reply.value.code, add_usage(usage, reply.usage)
        what = f"Wrote the client for iteration {iteration} ({reply.value.notes or 'no notes'})."
    for attempt in range(2):
        try:
            sources = {exp.name: studyfiles.set_factors(code, exp.factors) for exp in plan.experiments}
            break
        except ValueError as exc:
            problem = f"The experiments' client factors cannot be set in the client: {exc}"
            studyfiles.log(ctx.layout, f"Iteration {iteration}: {problem}")
            if attempt == 1:
                return {"phase": "failed", "llm": usage, "error": f"{problem} (even after a repair round)"}
            reply = ctx.planner.repair_client(code, problem, start, context)
            code, usage = reply.value.code, add_usage(usage, reply.usage)
            what += f" Repaired it to take the client factors ({reply.value.notes})."
    for exp in plan.experiments:
        studyfiles.write_experiment(ctx.layout, exp.name, sources[exp.name], configs[exp.name], exp.hypothesis)
    studyfiles.log(ctx.layout, f"{what} {coupling.describe(configs)}")
    ctx.say("client", iteration=iteration, repaired=bool(validation.get("error")))
    return {"phase": "validating", "llm": usage, "validation": validation}


def _previous_client(ctx: StudyContext, plans: PlanFile, iteration: int) -> str | None:
    """The client the last iteration ran (its first experiment's file), if it is on disk."""
    earlier = plans.iteration(iteration - 1).experiments
    if not earlier:
        return None
    path = ctx.layout.experiment_dir(earlier[0].name) / "client.py"
    return path.read_text() if path.is_file() else None


def _context(state: StudyState, framing: Framing, plan: IterationPlan, validation: Validation,
             continued: bool, now: float) -> JsonObject:
    """What the client writer and the repair step need beyond the code: the change asked for, the client
    factors and the budget left (repair rounds, runs, time, the smoke run's size)."""
    options = study_options(state)
    episodes, group = preflight.smoke_size(options.smoke_episodes)  # what validate's smoke run really runs
    return {"iteration": state["iteration"], "task": framing.task, "base_example": framing.example,
            "new_task": framing.task != framing.example,
            "starting_code": "the previous iteration's client" if continued else f"the {framing.example} example",
            "code_change": plan.code_change,
            "client_factors": {name: f.levels for name, f in framing.client_factors().items()},
            "budget": {"repair_rounds_left": max(state["budget"]["max_repairs"] - validation.get("attempts", 0), 0),
                       "runs_left": budget.runs_left(state), "time_left_s": round(budget.time_left(state, now)),
                       "steps_per_run": options.steps_per_run,
                       "seeds_per_experiment": options.seeds,
                       "smoke_run": {"episodes": episodes, "group_size": group,
                                     "timeout_s": options.smoke_timeout_s}}}
