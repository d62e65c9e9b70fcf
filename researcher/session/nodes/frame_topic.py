"""frame_topic: turn the topic into one testable question: a task, and what is varied.

The offline planner's world is the catalog: an example task and one catalog knob. The LLM planner
may also define a new task on the base of an example (``base``: its config.toml is the base config
and its client the starting code), vary any server config key, and declare several factors (server
keys and client-side factors the client reads from ``FACTORS``) for a factorial design; the catalog
is guidance in its prompt. A framing that cannot run as given (an unknown example, a server factor
that is not a config key, fewer than two levels) is re-asked once with the precise complaint, like
one that frames another question than the topic's: when the topic names values of a knob, or an
example task, a framing on another knob or task is re-asked, then refused.
"""

from __future__ import annotations

import itertools

from researcher.findings import verdicts
from researcher.planner import catalog, topic
from researcher.planner.schema import TopicNotMappable
from researcher.session.context import StudyContext
from researcher.study import files as studyfiles
from researcher.study.state import StudyState
from researcher.types.design import Framing, same_value
from researcher.types.usage import add_usage, new_usage


def frame(state: StudyState, ctx: StudyContext) -> StudyState:
    usage = state.get("llm") or new_usage()
    examples = catalog.examples(ctx.settings.examples_root)
    text = catalog.describe(ctx.settings.examples_root)
    open_world = ctx.planner.name != "offline"
    if open_world:  # the LLM may vary any key the server accepts, not only the catalog's knobs
        guide = f"{text}\nEvery server config key (the values are validated by the server before any run):\n" \
                f"{catalog.describe_config_keys()}"
    else:
        guide = text
    question = topic.parse(state["topic"])
    asked = state["topic"]
    for attempt in range(2):
        try:
            reply = ctx.planner.frame(asked, guide)
        except TopicNotMappable as exc:
            studyfiles.log(ctx.layout, f"Topic not mappable: {exc}")
            return {"phase": "failed", "error": str(exc), "llm": usage}
        framing, usage = reply.value, add_usage(usage, reply.usage)
        if not framing.answerable:
            problem = f"The planner cannot study this topic: {framing.reason}\n{text}"
            studyfiles.log(ctx.layout, problem.splitlines()[0])
            return {"phase": "failed", "error": problem, "llm": usage}
        if open_world:
            complaint = framing_problem(framing, examples) or topic_complaint(question, framing, examples)
        else:
            refused = _catalog_problem(framing, examples, text)
            if refused:
                studyfiles.log(ctx.layout, refused.splitlines()[0])
                return {"phase": "failed", "error": refused, "llm": usage}
            complaint = topic.framing_complaint(question, framing.knob, framing.task)
        if complaint is None:
            break
        studyfiles.log(ctx.layout, f"The planner's framing was refused: {complaint}")
        if attempt == 1:
            error = f"The {ctx.planner.name} planner does not frame the asked question, even after a repair round: " \
                    f"{complaint}"
            return {"phase": "failed", "error": error, "llm": usage}
        asked = f"{state['topic']}\n\n(Your previous framing was refused: {complaint} Frame exactly this topic.)"
    # The question states the axis the verdict is judged on (an LLM's wording may not).
    framing = framing.model_copy(update={"question": verdicts.question_with_axis(framing.question, framing.knob)})
    task = f"new task `{framing.task}` adapted from `{framing.base}`" if framing.base else f"task `{framing.task}`"
    factors = ("; factors " + ", ".join(f"{f.name} ({f.where}) in {f.levels}" for f in framing.factors)
               if framing.factors else "")
    studyfiles.log(ctx.layout, f"Framed the topic as: {framing.question} ({task}, knob `{framing.knob}`{factors}, "
                               f"metric `{framing.metric}`; planner {ctx.planner.name}). Read from "
                               f"the topic: {question.shape}"
                               + (f" of {question.knob} = {', '.join(map(str, question.values))}" if question.values else "")
                               + ".")
    ctx.tracker.describe_study(state["study_id"], f"Topic: {state['topic']}\n\nQuestion: {framing.question}\n\n"
                                                  "Answer: not yet (the study is running).")
    ctx.tracker.save_review_view(state["study_id"], framing.metric)  # analyze saves the judged metric's
    ctx.say("framed", question=framing.question, task=framing.task, knob=framing.knob)
    return {"framing": framing.model_dump(), "phase": "planning", "llm": usage}


def framing_problem(framing: Framing, examples: dict[str, catalog.ExampleStudy]) -> str | None:
    """Why an open-world (LLM) framing cannot run as given; None when it can.

    ``task`` is an example, or a new task when ``base`` names one; ``knob`` is a server config key or a
    framed factor; server factors are config keys, client factors are not; levels are distinct."""
    known = ", ".join(sorted(examples)) or "none"
    problems = []
    if framing.example not in examples:
        what = "base" if framing.base else "task"
        problems.append(f"{what} {framing.example!r} is not an example study (examples: {known}); a new task names "
                        "the example it starts from in `base`")
    elif framing.base and framing.task in examples and framing.task != framing.base:
        problems.append(f"task {framing.task!r} is another example than base {framing.base!r}: name a new task, or set "
                        "`task` to the example and leave `base` empty")
    names = [f.name for f in framing.factors]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        problems.append(f"factor(s) {', '.join(doubled)} are declared more than once")
    for f in framing.factors:
        if f.where == "server" and f.name not in catalog.CONFIG_KEYS:
            problems.append(f"server factor {f.name!r} is not a server config key (keys: {', '.join(catalog.CONFIG_KEYS)})"
                            "; a client-side factor has where=client")
        if f.where == "client" and f.name in catalog.CONFIG_KEYS:
            problems.append(f"client factor {f.name!r} has the name of a server config key: rename it, or make it a "
                            "server factor")
        if any(same_value(a, b) for a, b in itertools.combinations(f.levels, 2)):
            problems.append(f"factor {f.name!r} repeats a level ({f.levels}): its levels must differ")
    if framing.factors and framing.knob not in names:
        problems.append(f"knob {framing.knob!r} is not one of the factors ({', '.join(names)}): set `knob` to the "
                        "first factor")
    elif not framing.factors and framing.knob not in catalog.CONFIG_KEYS:
        problems.append(f"knob {framing.knob!r} is not a server config key; a client-side knob is declared in "
                        "`factors` with where=client and its levels")
    return "; ".join(problems) + "." if problems else None


def topic_complaint(question: topic.TopicQuestion, framing: Framing,
                     examples: dict[str, catalog.ExampleStudy]) -> str | None:
    """The topic's own reading against an open-world framing: a knob whose values the topic names must be
    varied (as the knob or one of the factors); a named example task must be the task or its base, unless
    the framing defines a new task (the keyword reading of a task then says nothing)."""
    names = {f.name for f in framing.factors}
    knob = question.knob if question.knob in names else framing.knob
    new_task = bool(framing.base) and framing.task not in examples
    return topic.framing_complaint(question, knob, question.task if new_task else framing.example)


def _catalog_problem(framing: Framing, examples: dict[str, catalog.ExampleStudy], text: str) -> str | None:
    """Why a catalog-world (offline) framing cannot run (unknown task or knob); None when it can."""
    if framing.task not in examples:
        return f"The planner chose task {framing.task!r}, which does not exist.\n{text}"
    try:
        catalog.knob(framing.knob)
    except KeyError:
        return f"The planner chose knob {framing.knob!r}, which is not configurable.\n{text}"
    return None
