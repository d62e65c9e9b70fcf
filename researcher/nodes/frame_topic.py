"""frame_topic: turn the topic into one testable question on a known task and knob.

The framing must be about what the topic names: when the topic names values of a knob, or a
task, a framing on another knob or task is re-asked once with the precise complaint, then refused.
"""

from __future__ import annotations

from typing import Any

from researcher import catalog, studyfiles
from researcher.context import StudyContext
from researcher.planner import topic
from researcher.planner.schema import Framing, TopicNotMappable
from researcher.planner.usage import add_usage, new_usage
from researcher.state import StudyState


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    usage = state.get("llm") or new_usage()
    examples = catalog.examples(ctx.settings.examples_root)
    text = catalog.describe(ctx.settings.examples_root)
    question = topic.parse(state["topic"])
    asked = state["topic"]
    for attempt in range(2):
        try:
            reply = ctx.planner.frame(asked, text)
        except TopicNotMappable as exc:
            studyfiles.log(ctx.layout, f"Topic not mappable: {exc}")
            return {"phase": "failed", "error": str(exc), "llm": usage}
        framing, usage = reply.value, add_usage(usage, reply.usage)
        problem = _problem(framing, examples, text)
        if problem:
            studyfiles.log(ctx.layout, problem.splitlines()[0])
            return {"phase": "failed", "error": problem, "llm": usage}
        complaint = topic.framing_complaint(question, framing.knob, framing.task)
        if complaint is None:
            break
        studyfiles.log(ctx.layout, f"The planner's framing was refused: {complaint}")
        if attempt == 1:
            error = f"The {ctx.planner.name} planner does not frame the asked question, even after a repair round: " \
                    f"{complaint}"
            return {"phase": "failed", "error": error, "llm": usage}
        asked = f"{state['topic']}\n\n(Your previous framing was refused: {complaint} Frame exactly this topic.)"
    studyfiles.log(ctx.layout, f"Framed the topic as: {framing.question} (task `{framing.task}`, knob "
                               f"`{framing.knob}`, metric `{framing.metric}`; planner {ctx.planner.name}). Read from "
                               f"the topic: {question.shape}"
                               + (f" of {framing.knob} = {', '.join(map(str, question.values))}" if question.values else "")
                               + ".")
    ctx.say("framed", question=framing.question, task=framing.task, knob=framing.knob)
    return {"framing": framing.model_dump(), "phase": "planning", "llm": usage}


def _problem(framing: Framing, examples: dict[str, catalog.ExampleStudy], text: str) -> str | None:
    """Why a framing cannot run at all (unanswerable, unknown task or knob); None when it can."""
    if not framing.answerable:
        return f"The planner cannot study this topic: {framing.reason}\n{text}"
    if framing.task not in examples:
        return f"The planner chose task {framing.task!r}, which does not exist.\n{text}"
    try:
        catalog.knob(framing.knob)
    except KeyError:
        return f"The planner chose knob {framing.knob!r}, which is not configurable.\n{text}"
    return None
