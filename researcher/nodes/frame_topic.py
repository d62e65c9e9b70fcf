"""frame_topic: turn the topic into one testable question on a known task and knob."""

from __future__ import annotations

from typing import Any

from researcher import catalog, studyfiles
from researcher.context import StudyContext
from researcher.planner.schema import TopicNotMappable
from researcher.planner.usage import add_usage, new_usage
from researcher.state import StudyState


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    usage = state.get("llm") or new_usage()
    examples = catalog.examples(ctx.settings.examples_root)
    text = catalog.describe(ctx.settings.examples_root)
    try:
        reply = ctx.planner.frame(state["topic"], text)
    except TopicNotMappable as exc:
        studyfiles.log(ctx.layout, f"Topic not mappable: {exc}")
        return {"phase": "failed", "error": str(exc)}
    framing, usage = reply.value, add_usage(usage, reply.usage)
    problem = None
    if not framing.answerable:
        problem = f"The planner cannot study this topic: {framing.reason}\n{text}"
    elif framing.task not in examples:
        problem = f"The planner chose task {framing.task!r}, which does not exist.\n{text}"
    else:
        try:
            catalog.knob(framing.knob)
        except KeyError:
            problem = f"The planner chose knob {framing.knob!r}, which is not configurable.\n{text}"
    if problem:
        studyfiles.log(ctx.layout, problem.splitlines()[0])
        return {"phase": "failed", "error": problem, "llm": usage}
    studyfiles.log(ctx.layout, f"Framed the topic as: {framing.question} (task `{framing.task}`, knob "
                               f"`{framing.knob}`, metric `{framing.metric}`; planner {ctx.planner.name}).")
    ctx.say("framed", question=framing.question, task=framing.task, knob=framing.knob)
    return {"framing": framing.model_dump(), "phase": "planning", "llm": usage}
