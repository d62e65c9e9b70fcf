"""The deterministic planner used when no LLM is configured.

It maps the topic onto one example task and one server knob by keywords, designs a controlled
comparison (everything but the knob held fixed, every configuration on the same seeds), and in
later iterations refines around the best value by walking the knob's ladder (successive halving:
keep the winner, challenge it with its untested neighbour). Its client is the example's own code.
"""

from __future__ import annotations

import re
from typing import Any

from researcher import catalog
from researcher.planner.schema import (ClientCode, Decision, Experiment, Framing, Hypothesis, Plan, Reply,
                                       ReportText, TopicNotMappable, free)


def _matches(text: str, phrase: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?![a-z0-9])", text) is not None


def _value_name(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")


class OfflinePlanner:
    name = "offline"

    def __init__(self, available_tasks: list[str]) -> None:
        self.available_tasks = available_tasks
        self._framed: dict[tuple[str, str], Reply[Framing]] = {}

    # ------------------------------------------------------------------ frame

    def frame(self, topic: str, catalog_text: str) -> Reply[Framing]:
        """Framing is deterministic, so a topic is framed once per planner: ``researcher start``
        frames it early (to refuse an unmappable topic before writing anything) and the graph's
        frame_topic then gets the same answer without framing it again."""
        key = (topic, catalog_text)
        if key not in self._framed:
            self._framed[key] = self._frame(topic, catalog_text)
        return self._framed[key]

    def _frame(self, topic: str, catalog_text: str) -> Reply[Framing]:
        text = topic.lower()
        best: tuple[int, catalog.Knob] | None = None
        for item in catalog.KNOBS:
            for phrase in item.keywords:
                if _matches(text, phrase) and (best is None or len(phrase) > best[0]):
                    best = (len(phrase), item)
        if best is None:
            raise TopicNotMappable(
                f"The offline planner cannot map this topic onto an experiment: {topic!r}.\n"
                "Name one of the knobs below (optionally a task), e.g. \"Does a larger group size make "
                "the letters task learn faster?\", or configure an LLM planner (RESEARCHER_LLM_BASE_URL, "
                "RESEARCHER_LLM_MODEL).\n" + catalog_text)
        knob = best[1]
        task = knob.task or next((name for name, words in catalog.TASK_KEYWORDS.items()
                                  if any(_matches(text, w) for w in words)), catalog.DEFAULT_TASK)
        if task not in self.available_tasks:
            raise TopicNotMappable(f"The topic needs the example study {task!r}, which is not installed "
                                   f"(found: {self.available_tasks}).\n" + catalog_text)
        question = (f"How does the {knob.label} (`{knob.key}`) change how fast the {task} task learns, "
                    "measured as the area under the reward curve per training step?")
        return free(Framing(answerable=True, reason=f"topic names the {knob.label}", question=question,
                            task=task, knob=knob.key))

    # ------------------------------------------------------------------ plan

    def plan(self, framing: Framing, context: dict[str, Any]) -> Reply[Plan]:
        knob = catalog.knob(framing.knob)
        tested: list[Any] = list(context.get("tested_values", []))
        best = context.get("best_value")
        iteration = int(context.get("iteration", 1))
        if iteration <= 1 or best is None:
            values = list(knob.first)
            hypothesis = Hypothesis(
                id=f"h{iteration}", metric=framing.metric,
                statement=f"Changing {knob.key} from {values[0]} to {values[-1]} changes the learning speed of "
                          f"{framing.task}.",
                expected_effect=f"{knob.key}={values[-1]} reaches a higher area under the {framing.metric} "
                                f"curve per step than {knob.key}={values[0]} (difference > 0.02).")
            rationale = "Controlled comparison: only the knob differs; every configuration runs the same seeds."
        else:
            challenger = _untested_neighbour(knob, best, tested)
            if challenger is None:
                values = [best]
            else:
                values = [best, challenger]
            hypothesis = Hypothesis(
                id=f"h{iteration}", metric=framing.metric,
                statement=f"{knob.key}={challenger} beats the current best {knob.key}={best}.",
                expected_effect=f"area under the {framing.metric} curve of {knob.key}={challenger} exceeds that "
                                f"of {best} by more than the minimum effect; otherwise the knob has plateaued.")
            rationale = ("Successive halving: keep the best configuration, challenge it with its untested "
                         "neighbour on fresh seeds.")
        experiments = [Experiment(name=f"it{iteration}-{knob.key.replace('_', '-')}-{_value_name(v)}",
                                  hypothesis=hypothesis.id, overrides={knob.key: v}) for v in values]
        return free(Plan(hypotheses=[hypothesis], experiments=experiments, rationale=rationale))

    # ------------------------------------------------------------------ client code

    def write_client(self, framing: Framing, example_source: str, experiments: list[dict[str, Any]]) -> Reply[ClientCode]:
        return free(ClientCode(code=example_source, notes=f"the {framing.task} example client, unchanged"))

    def repair_client(self, code: str, error: str, example_source: str) -> Reply[ClientCode]:
        # The offline planner cannot reason about a traceback; the example is its known-good fallback.
        return free(ClientCode(code=example_source, notes="reverted to the example client"))

    # ------------------------------------------------------------------ decide and report

    def decide(self, framing: Framing, context: dict[str, Any]) -> Reply[Decision]:
        knob = catalog.knob(framing.knob)
        last = context["last"]
        if last.get("plateau"):
            return free(Decision(action="conclude", reason=last["plateau"]))
        if _untested_neighbour(knob, last.get("best_value"), context.get("tested_values", [])) is None:
            return free(Decision(action="conclude", reason="every neighbour of the best value has been tested"))
        return free(Decision(action="continue",
                             reason=f"refine around the best value {knob.key}={last.get('best_value')}"))

    def report(self, framing: Framing, context: dict[str, Any]) -> Reply[ReportText]:
        return free(ReportText(answer=context["verdict"], discussion=context["caveats"]))


def _untested_neighbour(knob: catalog.Knob, best: Any, tested: list[Any]) -> Any:
    """The ladder value next to ``best`` not yet tested, preferring the direction that won so far."""
    ladder = list(knob.ladder)
    if best not in ladder:
        return None
    i = ladder.index(best)
    tested_set = {repr(v) for v in tested}
    # Prefer moving further in the direction that won: if best is above the other tested values, go up.
    others = [ladder.index(v) for v in tested if v in ladder and v != best]
    order = [i + 1, i - 1] if not others or max(others) < i else [i - 1, i + 1]
    for j in order:
        if 0 <= j < len(ladder) and repr(ladder[j]) not in tested_set:
            return ladder[j]
    return None
