"""decide: continue with another iteration or conclude (a resolved answer, stop request, or budget).

The planner sees the topic, the values of the last iteration's arms and the whole study's pooled
comparison (its metric, axis and noise floor; a factorial's effects with their intervals), so it can
tell an unresolved difference (re-run those arms on fresh seeds) from a resolved one (refine or conclude).
"""

from __future__ import annotations

from researcher.evidence import sizing
from researcher.findings.records import Comparison
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.state import DecisionRecord, StudyState, framed, study_options, summaries
from researcher.types.usage import add_usage, new_usage


def decide(state: StudyState, ctx: StudyContext) -> StudyState:
    options, history = study_options(state), summaries(state)
    last = history[-1]
    left = budget.time_left(state, ctx.clock())
    # The next look needs at least one more seed of a pair of arms within the time and runs left.
    room = sizing.room_now(state, ctx.clock())
    _size_after_pilot(ctx, last.comparison, room, options.min_effect)
    hard = None
    if ctx.stop_requested():
        hard = "a stop was requested"
    elif last.best is None:
        hard = "this iteration produced no usable run; nothing to refine"
    elif state["iteration"] >= state["budget"]["max_iterations"]:
        hard = f"reached the iteration limit ({state['budget']['max_iterations']})"
    elif room.seeds_per_look(1) < 1:
        hard = (f"the budget runs no further look: {budget.runs_left(state)} runs and {left:.0f} s left before the "
                f"report reserve, a run takes about {room.run_s:.0f} s")
    elif budget.llm_exhausted(state):
        hard = budget.llm_exhausted(state)
    usage = state.get("llm") or new_usage()
    decision: DecisionRecord
    if hard:
        decision = {"action": "conclude", "reason": hard}
    else:
        study = last.study.dump() if last.study else {}
        context = {"topic": state["topic"],
                   "last": {**last.model_dump(include={"iteration", "best", "best_value", "comparison", "plateau"}),
                            "values": {e.name: e.value for e in last.experiments},
                            # the whole study's evidence behind ``comparison`` (seeds pooled over iterations),
                            # and a factorial's main effects and interactions with their intervals
                            **{k: study.get(k) for k in ("metric", "axis", "noise_floor", "effects")}},
                   "tested_values": [e.value for s in history for e in s.experiments],
                   "time_left_s": round(left), "runs_left": budget.runs_left(state), "min_effect": options.min_effect}
        reply = ctx.planner.decide(framed(state), context)
        usage = add_usage(usage, reply.usage)
        decision = {"action": reply.value.action, "reason": reply.value.reason}
    studyfiles.log(ctx.layout, f"Decision after iteration {state['iteration']}: {decision['action']} — "
                               f"{decision['reason']}.")
    ctx.say("decided", **decision)
    if decision["action"] == "continue" and options.park_after_look:
        # A campaign's study: the campaign gives the next look's seeds to whichever hypothesis is closest
        # to settling, and resumes this one when it is its turn (the registered looks are unchanged).
        ctx.park(f"look {state['iteration']} done: the campaign decides which hypothesis gets the next seeds")
    return {"decision": decision, "llm": usage,
            "phase": "planning" if decision["action"] == "continue" else "reporting"}


def _size_after_pilot(ctx: StudyContext, pilot: Comparison | None, room: sizing.Room, min_effect: float) -> None:
    """Right after the pilot's analysis, whatever is decided next: the study sized from the pilot's spread
    and the budget (plan.json), said at once, on the terminal and in LOG.md, when the budget cannot decide."""
    design = studyfiles.read_plan(ctx.layout).design
    if design is None or design.max_seeds is not None or design.looks < 2:
        return
    if pilot is not None and pilot.fraction is not None:
        return  # the pilot was the only look the budget ran (``analyze``): nothing is left to size
    design = sizing.size(design, pilot, room, min_effect)
    studyfiles.write_design(ctx.layout, design)
    studyfiles.log(ctx.layout, design.sizing)
    ctx.say("sized", text=design.sizing, reachable=design.reachable, needed=design.needed_seeds,
            max_seeds=design.max_seeds)
