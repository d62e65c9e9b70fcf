"""plan_experiments: write this iteration's hypotheses and experiments down before anything runs.

The asked question is the tested question: whatever planner answers, its plan is checked against
the topic's own reading (``topic.parse``). A plan that drops a value the topic names, ignores a
value it fixes, or answers "how does X affect Y" with fewer than 4 values is re-asked once with
the precise complaint; a second miss is refused with a clear error and nothing is written. The
same round catches a plan that does not run the framed design (``design_check.design_complaint``) and,
for the LLM planner, configs the server refuses: every experiment's config is validated by the
server's own code (``swarm serve --check``, one process for the whole plan) and its message is the
complaint. The offline planner's values come from the catalog's bounded ladders, so its plans skip
that process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from researcher.evidence import factorial, sizing
from researcher.findings.records import IterationPlan, IterationSummary, JsonObject, LookPlan, SequentialDesign
from researcher.planner import arm_budgets, catalog, design_check, topic
from researcher.planner.schema import Planner, PlannerContext
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import run_key
from researcher.study.state import StudyState, Trial, framed, study_options, summaries
from researcher.types.design import Experiment, Framing, Plan
from researcher.types.settings import StudyOptions
from researcher.types.usage import LLMUsage, add_usage, new_usage

SEED_STRIDE = 1000  # iteration i uses seeds i*1000 + k: fresh seeds for every iteration


@dataclass
class CheckedPlan:
    plan: Plan
    usage: LLMUsage
    complaints: list[str]  # what was wrong with each refused answer, in order
    ok: bool               # the final plan tests the topic's question


ConfigCheck = Callable[[Plan], str | None]


def ask_checked(planner: Planner, framing: Framing, context: PlannerContext,
                question: topic.TopicQuestion, check: ConfigCheck | None = None) -> CheckedPlan:
    """Ask for a plan; when it does not test ``question``, does not run the framed design, or (with
    ``check``, e.g. ``config_check``) holds a config the server refuses, ask once more with the
    complaint (and the refused plan) in the context, and report whether the second answer passes."""
    usage = new_usage()
    complaints: list[str] = []
    tested = list(context.get("tested_values", []))
    room = max(int(context.get("runs_left", 0)) // max(int(context.get("seeds_per_experiment", 1)), 1), 1)
    # A knob the topic names may be one factor of a factorial; client levels count as arms' settings too.
    knob = question.knob if question.knob in {f.name for f in framing.factors} else framing.knob
    asked = dict(context)
    for _ in range(2):
        reply = planner.plan(framing, asked)
        usage = add_usage(usage, reply.usage)
        arms = [factorial.arm_settings(e) for e in reply.value.experiments]
        # A factorial runs two levels of each factor: the named values still run, but no dose-response curve.
        read = replace(question, shape="comparison") if reply.value.shape == "factorial" else question
        found = [topic.plan_complaint(read, knob, arms, tested, room),
                 design_check.design_complaint(framing, reply.value), check(reply.value) if check else None]
        complaint = " ".join(c for c in found if c) or None
        if complaint is None:
            return CheckedPlan(reply.value, usage, complaints, True)
        complaints.append(complaint)
        asked = {**context, "complaint": f"Your previous plan was refused: {complaint} Fix exactly this.",
                 "refused_plan": reply.value.model_dump()}
    return CheckedPlan(reply.value, usage, complaints, False)


def config_check(swarm_command: Sequence[str], base_config: Path) -> ConfigCheck:
    """A plan check: every experiment's config (``base_config`` + its overrides) as the server validates it,
    in one ``swarm serve --check`` process; the complaint quotes the server's own message."""

    def check(plan: Plan) -> str | None:
        configs, refused = {}, {}
        for exp in plan.experiments:
            try:
                configs[exp.name] = studyfiles.server_config(base_config, exp.overrides)
            except ValueError as exc:
                refused[exp.name] = str(exc)
        refused |= studyfiles.check_configs(swarm_command, configs)
        if not refused:
            return None
        by_reason: dict[str, list[str]] = {}
        for name, why in refused.items():
            by_reason.setdefault(why, []).append(name)
        return "; ".join(f"the server refuses the config of experiment(s) {', '.join(names)}: {why}"
                         for why, names in by_reason.items()) + "."

    return check


def plan_iteration(state: StudyState, ctx: StudyContext) -> StudyState:
    framing = framed(state)
    options = study_options(state)
    iteration = state.get("iteration", 0) + 1
    history = summaries(state)
    question = topic.on_task(topic.parse(state["topic"]), framing.task)
    example = catalog.examples(ctx.settings.examples_root).get(framing.example)
    context = _context(state, ctx, framing, question, history, example.config if example else None)
    check = None
    if ctx.planner.name != "offline" and example is not None:
        check = config_check(ctx.settings.swarm_command, example.config)
    try:
        checked = ask_checked(ctx.planner, framing, context, question, check)
    except studyfiles.ConfigCheckError as exc:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the plan's configs could not be checked: {exc}")
        return {"phase": "failed", "error": f"the plan's configs could not be checked: {exc}",
                "llm": state.get("llm") or new_usage()}
    plan, usage = checked.plan, add_usage(state.get("llm") or new_usage(), checked.usage)
    for complaint in checked.complaints:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the planner's plan was refused: {complaint}")
    if not checked.ok:
        error = (f"The {ctx.planner.name} planner's plan was refused, even after a repair round: "
                 f"{checked.complaints[-1]}")
        return {"phase": "failed", "error": error, "llm": usage}
    used = {e.name for s in history for e in s.experiments}
    design, look, seeds = _this_look(state, ctx, history, len(_runnable(plan, used, budget.runs_left(state), 1)[0]))
    if look is None:
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the budget runs no further seed; concluding.")
        return {"phase": "reporting", "llm": usage,
                "decision": {"action": "conclude", "reason": "the budget runs no further look"}}
    experiments, notes = _runnable(plan, used, budget.runs_left(state), seeds)
    if len(experiments) < min(2, len(plan.experiments)):
        studyfiles.log(ctx.layout, f"Iteration {iteration}: the run budget does not fit a comparison "
                                   f"({len(experiments)} configuration(s)); concluding.")
        return {"phase": "reporting", "llm": usage, "decision": {"action": "conclude", "reason": "run budget spent"}}
    arm_plans = _arm_budgets(experiments, options.steps_per_run, example, notes)
    assumptions = _unique([*question.assumptions, *plan.assumptions, *notes])
    written = IterationPlan.model_validate({
        "rationale": plan.rationale, "shape": plan.shape, "stage": plan.stage, "assumptions": assumptions,
        "code_change": plan.code_change,
        "question": {k: v for k, v in question.summary().items() if k != "assumptions"},
        "hypotheses": [h.model_dump() for h in plan.hypotheses],
        "experiments": [{**e.model_dump(), **arm_plans[e.name]} for e in experiments],
        "seeds": [_seed(options, iteration, k) for k in range(seeds)], "steps_per_run": options.steps_per_run,
        **({"look": look.dump()} if design else {})})
    studyfiles.write_plan(ctx.layout, iteration, written, framing.model_dump(), design)
    trials: list[Trial] = []
    # Seed-major order: every configuration gets its first seed before any gets its second.
    for k in range(seeds):
        for exp in experiments:
            index = len(trials)
            trials.append({"trial": index, "key": run_key(state["study_id"], iteration, index),
                           "experiment": exp.name, "seed": _seed(options, iteration, k),
                           "run_dir": str(ctx.layout.run_dir(iteration, index)), "status": "pending"})
    parent = _record_plan(state, ctx, framing, plan, experiments, assumptions, seeds)
    return {"iteration": iteration, "experiments": [e.name for e in experiments], "trials": trials,
            "validation": {"attempts": 0, "ok": False, "error": None}, "mlflow_parent_run": parent,
            "phase": "writing", "llm": usage}


def _arm_budgets(experiments: list[Experiment], steps: int, example: catalog.ExampleStudy | None,
                 notes: list[str]) -> dict[str, JsonObject]:
    """Each experiment's steps, episodes and held-out cadence (``arm_budgets.matched``); a note in ``notes``
    where they differ between arms (matched on episodes consumed)."""
    if example is None:
        return {e.name: {} for e in experiments}
    configs = {e.name: studyfiles.server_config(example.config, e.overrides) for e in experiments}
    budgets = arm_budgets.matched(configs, steps, arm_budgets.client_eval_every(example.client))
    if len({b.steps for b in budgets.values()}) > 1:
        notes.append("arms consume different episodes per training step, so each trains to the same episodes: "
                     + ", ".join(f"{name} {b.steps} steps ({b.episodes} episodes, held-out every {b.eval_every} "
                                 "steps)" for name, b in budgets.items()))
    return {name: {k: v for k, v in asdict(b).items() if v is not None} for name, b in budgets.items()}


def _this_look(state: StudyState, ctx: StudyContext, history: list[IterationSummary],
               arms: int) -> tuple[SequentialDesign | None, LookPlan | None, int]:
    """The study's decision rule, this iteration's look and the seeds it adds, registered before its runs:
    the design and the pilot on the first iteration; later, each look's seeds within the budget the pilot
    sized the study to (``decide`` sizes it; look None: no seed fits)."""
    options = study_options(state)
    plan_file = studyfiles.read_plan(ctx.layout)
    design = plan_file.design
    if not history:
        design = sizing.register(state["budget"]["max_iterations"], options.seeds, options.alpha)
        return design, sizing.pilot_look(design), options.seeds
    previous = plan_file.iteration(state.get("iteration", 0)).look
    if design is None or previous is None:  # a study registered before sequential looks: fixed seeds
        return None, LookPlan(look=state.get("iteration", 0) + 1, seeds=options.seeds), options.seeds
    room = sizing.room_now(state, ctx.clock(), max(arms, 1))
    look = sizing.next_look(design, previous, room)
    return design, look, look.seeds - previous.seeds if look else 0


def _seed(options: StudyOptions, iteration: int, k: int) -> int:
    """The k-th seed of an iteration: fresh per iteration, shifted by the study's ``seed_base``."""
    return options.seed_base + iteration * SEED_STRIDE + k


def _context(state: StudyState, ctx: StudyContext, framing: Framing, question: topic.TopicQuestion,
             history: list[IterationSummary], example_config: Path | None) -> JsonObject:
    """What the planner plans from: the question's reading, the budget, the task's config and the
    study's history (each iteration's pooled comparison, values and factorial effects)."""
    options = study_options(state)
    earlier = studyfiles.read_plan(ctx.layout).iterations
    context: PlannerContext = {
        "iteration": state.get("iteration", 0) + 1, "topic": state["topic"], "named": question.summary(),
        "seeds_per_experiment": options.seeds, "steps_per_run": options.steps_per_run,
        "min_effect": options.min_effect,
        "task_config": studyfiles.server_config(example_config, {}) if example_config else {},
        "tested_values": [e.value for s in history for e in s.experiments],
        "best_value": history[-1].best_value if history else None,
        "time_left_s": round(budget.time_left(state, ctx.clock())), "runs_left": budget.runs_left(state),
        "history": [{**s.model_dump(include={"iteration", "best", "best_value", "comparison", "plateau"}),
                     "values": {e.name: e.value for e in s.experiments},
                     **({"effects": _effects(s)} if _effects(s) else {})} for s in history],
        "config_keys": catalog.CONFIG_KEYS,
        "code_changes": {str(it): p.code_change for it, p in earlier.items() if p.code_change}}
    if any(k.key == framing.knob for k in catalog.KNOBS):
        context["knob_ladder"] = list(catalog.knob(framing.knob).ladder)
    return context


def _runnable(plan: Plan, used_names: set[str], runs_left: int, seeds: int) -> tuple[list[Experiment], list[str]]:
    """The plan's experiments that run: none that already ran, and as many as the run budget fits
    (``seeds`` runs each); with a note for each left out."""
    experiments, seen, notes = [], set(used_names), []
    for exp in plan.experiments:
        if exp.name in seen:
            notes.append(f"{exp.name} already ran; not repeated")
            continue  # never repeat an experiment that already ran
        seen.add(exp.name)
        experiments.append(exp)
    fit = runs_left // seeds
    if fit < len(experiments):
        dropped = experiments[fit:]
        notes.append(f"the run budget ({runs_left} runs left, {seeds} seeds each) fits {fit} of "
                     f"{len(experiments)} configurations: not run " + ", ".join(_show(e) for e in dropped))
    return experiments[:fit], notes


def _record_plan(state: StudyState, ctx: StudyContext, framing: Framing, plan: Plan, experiments: list[Experiment],
                 assumptions: list[str], seeds: int) -> str:
    """The plan in LOG.md and on a new MLflow parent run of the iteration (returned), with plan.json."""
    options, iteration = study_options(state), state.get("iteration", 0) + 1
    hypotheses = "; ".join(f"{h.id}: {h.statement} Expected: {h.expected_effect}" for h in plan.hypotheses)
    studyfiles.log(ctx.layout, f"Iteration {iteration} planned ({plan.shape}, {plan.stage}; {plan.rationale}) "
                               f"Hypotheses, written before running: {hypotheses} Experiments: "
                               + ", ".join(_show(e) for e in experiments)
                               + f"; {seeds} seeds each, {options.steps_per_run} steps per run."
                               + (" Assumed: " + "; ".join(assumptions) + "." if assumptions else ""))
    if plan.code_change:
        studyfiles.log(ctx.layout, f"Iteration {iteration} changes the client code: {plan.code_change}")
    note = (f"Iteration {iteration} of a study of: {framing.question}\n\nHypotheses: {hypotheses}\n\n"
            f"Experiments ({seeds} seeds each): " + ", ".join(_show(e) for e in experiments))
    parent = ctx.tracker.start_parent(state["study_id"], iteration, {"researcher.knob": framing.knob,
                                                                     "researcher.task": framing.task},
                                      description=note)
    # ``planned_metric``: analysis may judge on another (eval/* when held-out rounds suffice); the
    # parent's ``researcher.metric`` tag names the one the verdict used.
    ctx.tracker.log_params(parent, {"knob": framing.knob, "task": framing.task, "planned_metric": framing.metric,
                                    "seeds": seeds, "steps_per_run": options.steps_per_run,
                                    "shape": plan.shape, "stage": plan.stage,
                                    "experiments": ",".join(e.name for e in experiments),
                                    **({"base": framing.base} if framing.base else {}),
                                    **({"factors": ",".join(f.name for f in framing.factors)} if framing.factors
                                       else {}),
                                    **({"code_change": plan.code_change[:500]} if plan.code_change else {})})
    ctx.tracker.log_files(parent, [ctx.layout.plan_json])
    ctx.say("planned", iteration=iteration, experiments=[e.name for e in experiments], seeds=seeds,
            rationale=plan.rationale, hypotheses=[h.statement for h in plan.hypotheses])
    return parent


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _show(exp: Experiment) -> str:
    return f"{exp.name} {json.dumps(exp.overrides)}" + (f" client {json.dumps(exp.factors)}" if exp.factors else "")


def _effects(summary: IterationSummary) -> list[JsonObject]:
    """A factorial iteration's effects as the planner needs them (estimate, interval, resolved)."""
    return [e.model_dump(include={"name", "estimate", "low", "high", "resolved", "aliases"})
            for e in (summary.study.effects if summary.study else [])]

