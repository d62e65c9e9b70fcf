"""The deterministic planner used when no LLM is configured.

It reads the topic with ``topic.parse`` and runs exactly what the topic asks: the named values of
the named knob on the named task. "A vs B" and "does X help" become a controlled comparison of
those arms (one named value is compared with the knob's off/standard value, said in the plan's
assumptions); "how does X affect Y" and "what is the best X" become a dose-response sweep over at
least 4 values across the knob's range. Everything but the knob is held fixed and every
configuration runs on the same seeds. Later iterations follow the evidence: an unresolved
difference (``researcher.findings.verdicts``: inconclusive, or below the minimum of interest with a CI
reaching past it) is re-run on fresh seeds before anything new is tried; a resolved sweep is refined
around its best value; a settled comparison is done (a yes/no topic is answered by its pair). An
A/A check runs two arms with the identical configuration under different names (``it1-a``,
``it1-a-copy``), re-run under fresh names while their difference is unresolved.
Its client is the example's own code.
"""

from __future__ import annotations

import re
from typing import Any, Literal, NamedTuple

from researcher.findings.axes import AXIS_TEXT, EVAL_METRIC, primary_axis
from researcher.findings.records import Comparison, Effect, JsonObject
from researcher.findings.verdicts import Verdict, classify, settled
from researcher.planner import catalog, ladder, screen
from researcher.planner.catalog import show as _show
from researcher.planner.schema import ClientCode, Decision, PlannerContext, Reply, ReportText, TopicNotMappable, free
from researcher.planner.topic import MIN_SWEEP, TopicQuestion, parse
from researcher.types.design import DATA_TASK, Experiment, Framing, Hypothesis, Plan, same_value

MAX_ARMS = 8  # Plan.experiments holds at most 8 configurations


def _value_name(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")


def _shows(values: list[Any]) -> str:
    return ", ".join(_show(v) for v in values)


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
        question = parse(topic)
        if question.knob is None and question.open:
            task = self._task(question, catalog_text)
            return free(screen.framing(task))
        if question.knob is None:
            raise TopicNotMappable(
                f"The offline planner cannot map this topic onto an experiment: {topic!r}.\n"
                "Name one of the knobs below (optionally a task), e.g. \"Does a larger group size make "
                "the letters task learn faster?\", or configure an LLM planner (RESEARCHER_LLM_BASE_URL, "
                "RESEARCHER_LLM_MODEL).\n" + catalog_text)
        knob, task = catalog.knob(question.knob), self._task(question, catalog_text)
        # The axis the verdict is judged on (per episode consumed for group and batch sizes), so the
        # question printed above the answer asks what the answer answers.
        reward = knob.metric == catalog.REWARD_METRIC
        curve = "reward" if reward else f"`{knob.metric}`"
        measure = f"measured as the area under the {curve} curve {AXIS_TEXT[primary_axis(knob.key)[0]]}"
        values = [_show(v) for v in question.values]
        named = " or ".join([", ".join(values[:-1]), values[-1]] if len(values) > 2 else values)
        if question.identical:
            setting = f"{knob.key} = {values[0]}" if values else f"{knob.key} as the task configures it"
            text = (f"Do two identical configurations of the {task} task ({setting}) learn at different speeds, "
                    f"{measure}? (An A/A check: any difference between them is noise.)")
        elif question.shape == "sweep":
            over = f" over {knob.key} = {', '.join(values)}" if values else ""
            text = (f"How does the {knob.label} (`{knob.key}`) affect how fast the {task} task learns (a dose-response "
                    f"curve{over}), {measure}?")
        elif len(values) >= 2:  # a claim judged on entropy or lengths asks for a height, not for speed
            does = f"makes the {task} task learn faster" if reward else f"keeps the {task} task's {curve} higher"
            text = f"Which of {knob.key} = {named} {does}, {measure}?"
        elif values:
            change = f"how fast the {task} task learns" if reward else f"the {task} task's {curve}"
            text = f"Does setting {knob.key} to {named} change {change}, {measure}?"
        else:
            text = f"Does changing the {knob.label} (`{knob.key}`) change how fast the {task} task learns, {measure}?"
        reason = (f"topic asks for an A/A check, reported under {knob.key}" if question.identical else
                  f"topic names the {knob.label}" + (f" and {knob.key} = {', '.join(values)}" if values else ""))
        return free(Framing(answerable=True, reason=reason, question=text, task=task, knob=knob.key,
                            metric=knob.metric))

    def _task(self, question: TopicQuestion, catalog_text: str) -> str:
        """The example task a topic runs on; a study on the user's data when the topic names none."""
        task = question.task
        if not question.task_named and DATA_TASK in self.available_tasks:
            task = DATA_TASK  # a study on the user's data: a topic naming no example task is about it
        if task not in self.available_tasks:
            raise TopicNotMappable(f"The topic needs the example study {task!r}, which is not installed "
                                   f"(found: {self.available_tasks}).\n" + catalog_text)
        return task

    # ------------------------------------------------------------------ plan

    def plan(self, framing: Framing, context: PlannerContext) -> Reply[Plan]:
        """The first design the topic asks for; later, more seeds for an unresolved difference, else a refinement."""
        if screen.is_screen(framing):
            return free(screen.plan(framing, int(context.get("iteration", 1))))
        knob = _catalog_knob(framing, "plan")
        question = _question(framing, context)
        iteration = int(context.get("iteration", 1))
        history = context.get("history") or []
        min_effect = float(context.get("min_effect", 0.02))
        best = context.get("best_value")
        unresolved = _unresolved(history[-1], min_effect) if history else None
        if question.identical:
            return free(_identical_plan(question, knob, framing, context.get("task_config") or {}, iteration,
                                        min_effect))
        if iteration <= 1 or best is None:
            design = _initial_design(question, knob, framing, context.get("task_config") or {}, min_effect)
        elif unresolved is not None:
            design = _replicate_design(knob, unresolved, history[-1], min_effect)
        else:
            design = _refine_design(question, knob, framing, best, list(context.get("tested_values", [])), min_effect)
        # Registered on the knob's metric (the held-out reward unless the catalog names another: _judged).
        hypothesis = Hypothesis(id=f"h{iteration}", metric=_judged(knob.key), statement=design.statement,
                                expected_effect=design.expected)
        experiments = [Experiment(name=f"it{iteration}-{knob.key.replace('_', '-')}-{_value_name(v)}",
                                  hypothesis=hypothesis.id, overrides={**question.fixed, knob.key: v})
                       for v in design.values]
        return free(Plan(hypotheses=[hypothesis], experiments=experiments, rationale=design.rationale,
                         shape=question.shape, stage=design.stage, assumptions=design.assumptions))

    # ------------------------------------------------------------------ client code

    def write_client(self, framing: Framing, example_source: str, experiments: list[JsonObject],
                     context: PlannerContext | None = None) -> Reply[ClientCode]:
        return free(ClientCode(code=example_source, notes=f"the {framing.task} example client, unchanged"))

    def repair_client(self, code: str, error: str, example_source: str,
                      context: PlannerContext | None = None) -> Reply[ClientCode]:
        # The offline planner cannot reason about a traceback; the example is its known-good fallback.
        return free(ClientCode(code=example_source, notes="reverted to the example client"))

    # ------------------------------------------------------------------ decide and report

    def decide(self, framing: Framing, context: PlannerContext) -> Reply[Decision]:
        """Never concludes "plateau" or "best" from an unresolved difference: that one gets more seeds. A
        framing on a knob outside the catalog (an LLM's, when this planner takes a step over) is concluded
        where refining it would need the knob's ladder. A screen ends after its one look (``screen.decide``)."""
        if screen.is_screen(framing):
            effects = [Effect.model_validate(e) for e in context["last"].get("effects") or []]
            return free(screen.decide(framing, effects, float(context.get("min_effect", 0.02))))
        question = _question(framing, context)
        last, tested = context["last"], context.get("tested_values", [])
        min_effect = float(context.get("min_effect", 0.02))
        c = Comparison.model_validate(last["comparison"]) if last.get("comparison") else None
        if c:
            spread = f"{c.diff:+.3f}" + (f" ± {c.hw:.3f}" if c.hw is not None else " (no interval)")
            verdict = classify(c.diff, c.hw, min_effect)
            if verdict is Verdict.NO_DIFFERENCE:
                return free(Decision(action="conclude", reason=f"no meaningful difference: {c.better} − {c.worse} "
                                                               f"= {spread}, inside ±{min_effect}"))
            if c.look == 1 and c.fraction is None:
                return free(Decision(action="continue", reason=(
                    f"the pilot ({c.better} − {c.worse} = {c.diff:+.3f} over {c.seeds} seeds) decides nothing: it "
                    "sizes the study; the next look re-runs these two arms on fresh seeds")))
            if not settled(verdict):
                why = ("includes 0" if verdict is Verdict.INCONCLUSIVE else
                       f"excludes 0 but the estimate is within ±{min_effect} and the CI reaches beyond it")
                return free(Decision(action="continue", reason=(
                    f"{c.better} vs {c.worse} is unresolved ({verdict.lower()}: the 95% CI of the difference, "
                    f"{spread}, {why}): the next iteration re-runs these two arms on fresh seeds instead of a new "
                    "pair")))
            if question.identical:
                return free(Decision(action="conclude", reason=f"the A/A check is resolved, against expectation: "
                                                               f"{c.better} − {c.worse} = {spread} between "
                                                               "identical configurations"))
            if question.shape == "comparison":
                # A yes/no topic is answered by its controlled comparison: refining around the winner would
                # make the Answer about another pair (16 vs 8 where the question was answered by 8 vs 2).
                arms = "named arms" if question.values else "arms"
                return free(Decision(action="conclude", reason=f"the comparison of the {arms} is resolved: "
                                                               f"{c.better} beat {c.worse} ({spread})"))
        if question.identical:  # nothing to refine: two arms of one configuration
            return free(Decision(action="conclude", reason="the A/A check has fewer than two arms with usable runs"))
        if not any(k.key == framing.knob for k in catalog.KNOBS):
            return free(Decision(action="conclude", reason=f"the offline planner refines only the catalog's knobs, "
                                                           f"and {framing.knob} is not one of them"))
        knob = catalog.knob(framing.knob)
        best = last.get("best_value")
        if question.shape == "sweep":
            around = ladder.around(knob, best, tested)
            if not around:
                return free(Decision(action="conclude", reason=f"every value next to {knob.key}={best} has been tested"))
            return free(Decision(action="continue", reason=f"refine the curve around {knob.key}={best} with "
                                                           f"{_shows(around)}"))
        if last.get("plateau"):
            return free(Decision(action="conclude", reason=last["plateau"]))
        if ladder.untested_neighbour(knob, best, tested) is None:
            return free(Decision(action="conclude", reason="every neighbour of the best value has been tested"))
        return free(Decision(action="continue", reason=f"refine around the best value {knob.key}={best}"))

    def report(self, framing: Framing, context: PlannerContext) -> Reply[ReportText]:
        """The analysis' wording, minus any plateau claim made from an unresolved difference."""
        caveats = context["caveats"]
        for summary in context.get("iterations", []):
            plateau, c = summary.get("plateau"), summary.get("comparison")
            if plateau and not (c and c.get("clear")):
                caveats = caveats.replace(f"; {plateau}", "; no plateau is claimed: the 95% CI of this iteration's "
                                                          "difference includes 0").replace(plateau, "")
        return free(ReportText(answer=context["verdict"], discussion=caveats))


# ---------------------------------------------------------------------- strategies


def _catalog_knob(framing: Framing, step: str) -> catalog.Knob:
    """The framing's knob, refused as unmappable when it is not a catalog knob (an LLM's framing may vary any key)."""
    if not any(k.key == framing.knob for k in catalog.KNOBS):
        raise TopicNotMappable(f"the offline planner can {step} only for the catalog's knobs "
                               f"({', '.join(k.key for k in catalog.KNOBS)}), and {framing.knob!r} is not one of them")
    return catalog.knob(framing.knob)


def _question(framing: Framing, context: PlannerContext) -> TopicQuestion:
    """The topic's reading when it is about the framed knob; otherwise one that names nothing."""
    question = parse(str(context.get("topic") or ""))
    if question.knob == framing.knob:
        return question
    return TopicQuestion(question.text, framing.knob, framing.task, False)


def _identical_plan(question: TopicQuestion, knob: catalog.Knob, framing: Framing, task_config: JsonObject,
                    iteration: int, min_effect: float) -> Plan:
    """An A/A check: two arms with the identical configuration (the task's, plus what the topic pins),
    named apart; a later iteration re-runs both under fresh names on fresh seeds."""
    key, task = knob.key, framing.task
    assumptions = []
    if question.values:
        value = question.values[0]
    else:
        value, why = _baseline(knob, task_config)
        assumptions.append(f"the topic names no {key} value: both arms run {key}={_show(value)}, the {why}")
    overrides = {**question.fixed, key: value}
    setting = ", ".join(f"{k}={_show(v)}" for k, v in overrides.items())
    hypothesis = Hypothesis(id=f"h{iteration}", metric=_judged(key),
                            statement=f"Two identical configurations of {task} ({setting}) learn at the same speed: "
                                      "any difference between them is noise.",
                            expected_effect=f"the 95% CI of the difference in {_measure(key)} includes "
                                            f"0, and with enough seeds lies within ±{min_effect}")
    names = [f"it{iteration}-a", f"it{iteration}-a-copy"]
    stage: Literal["initial", "replicate"] = "initial" if iteration <= 1 else "replicate"
    rationale = ("A/A check: two arms with the identical configuration under different names, on the same seeds; "
                 "their difference measures the noise floor, and a clear difference would be a false positive."
                 + ("" if stage == "initial" else " The last difference is unresolved: both arms re-run on fresh "
                                                  "seeds under fresh names."))
    return Plan(hypotheses=[hypothesis], rationale=rationale, shape="comparison", stage=stage, assumptions=assumptions,
                experiments=[Experiment(name=n, hypothesis=hypothesis.id, overrides=dict(overrides)) for n in names])


def _judged(key: str) -> str:
    """The metric a hypothesis on knob ``key`` registers: its catalog metric, the reward as the held-out
    ``eval/reward_mean`` every example client evaluates (the verdict's, unless a run lacks it)."""
    metric = catalog.knob(key).metric
    return EVAL_METRIC if metric == catalog.REWARD_METRIC else metric


def _measure(key: str) -> str:
    """What the hypotheses register: the verdict's metric and axis, named before any run."""
    metric = _judged(key)
    held_out = " held-out" if metric == EVAL_METRIC else ""
    return f"the area under the{held_out} `{metric}` curve {AXIS_TEXT[primary_axis(key)[0]]}"


class _Design(NamedTuple):
    stage: Literal["initial", "replicate", "refine"]
    values: list[Any]
    statement: str
    expected: str
    rationale: str
    assumptions: list[str]


def _initial_design(question: TopicQuestion, knob: catalog.Knob, framing: Framing, task_config: JsonObject,
                    min_effect: float) -> _Design:
    values, claim, assumptions = _initial(question, knob, task_config)
    key, task, measure = knob.key, framing.task, _measure(knob.key)
    if question.shape == "sweep":
        return _Design("initial", values, f"The learning speed of {task} changes with {key} over {_shows(values)}.",
                       f"{measure} differs by more than {min_effect} between the "
                       f"best and the worst of the {len(values)} values",
                       f"Dose-response sweep over {len(values)} values of {key}; every value runs the same seeds.",
                       assumptions)
    others = [v for v in values if not same_value(v, claim)]
    return _Design("initial", values,
                   f"{key}={_show(claim)} makes {task} learn at a different speed than {key}={_shows(others)}.",
                   f"{key}={_show(claim)} reaches a higher {measure.removeprefix('the ')} than "
                   f"{key}={_shows(others)} (difference > {min_effect}).",
                   "Controlled comparison: only the knob differs; every configuration runs the same seeds.", assumptions)


def _replicate_design(knob: catalog.Knob, pair: tuple[Any, Any], last: JsonObject, min_effect: float) -> _Design:
    c, key = Comparison.model_validate(last["comparison"]), knob.key
    spread = f"{c.diff:+.3f}" + (f" ± {c.hw:.3f}" if c.hw is not None else "")
    return _Design("replicate", list(pair),
                   f"The difference between {key}={_show(pair[0])} and {key}={_show(pair[1])} seen in iteration "
                   f"{last.get('iteration')} ({spread}, unresolved) is real.",
                   f"pooled with fresh seeds, the 95% CI of the difference in {_measure(key)} excludes 0 with "
                   f"the estimate beyond ±{min_effect}, or lies within ±{min_effect} (no meaningful difference)",
                   "The last difference is unresolved: re-run the same two arms on fresh seeds (more evidence) "
                   "instead of a new pair.", [])


def _refine_design(question: TopicQuestion, knob: catalog.Knob, framing: Framing, best: Any, tested: list[Any],
                   min_effect: float) -> _Design:
    if question.shape == "sweep":
        around = ladder.around(knob, best, tested)
    else:
        challenger = ladder.untested_neighbour(knob, best, tested)
        around = [] if challenger is None else [challenger]
    key, new = knob.key, _shows(around) or "nothing new"
    return _Design("refine", [best, *around],
                   f"{key}={new} next to the best so far ({key}={_show(best)}) beats it.",
                   f"{_measure(key)} of {key}={new} exceeds that of {key}={_show(best)} by "
                   f"more than {min_effect}; otherwise {_show(best)} stays the best measured value",
                   "Refinement: keep the best configuration of a resolved result and challenge it with the values "
                   "next to it, on fresh seeds.", [])


def _initial(question: TopicQuestion, knob: catalog.Knob, task_config: JsonObject) -> tuple[list[Any], Any, list[str]]:
    """The first design's values, the one the hypothesis names as the winner, and what was assumed."""
    named, key, notes = list(question.values), knob.key, []
    if question.shape == "sweep":
        if question.span:
            values = ladder.spread(knob, named[0], named[1])
            notes.append(f"swept {len(values)} values of {key} from {_show(min(values))} to {_show(max(values))}: the "
                         "named ends and points between them")
        elif len(named) >= 3:
            values = named
            if len(named) < MIN_SWEEP:
                notes.append(f"the topic names {len(named)} values of {key}: the curve has those {len(named)} points")
        else:
            values = _sorted(knob, [*knob.ladder, *[v for v in named if not any(same_value(v, x) for x in knob.ladder)]])
            if len(knob.ladder) < MIN_SWEEP:
                notes.append(f"{key} has only {len(knob.ladder)} values: the sweep runs all of them")
            elif not named:
                notes.append(f"the topic names no values of {key}: swept the catalog's {len(values)} values across its "
                             f"range ({_shows(values)})")
        return _capped(values, key, notes), values[-1], notes
    if len(named) >= 2:
        return _capped(named, key, notes), named[0], notes
    if len(named) == 1:
        base, why = _baseline(knob, task_config)
        value = named[0]
        if same_value(value, base):
            other = next(v for v in knob.first if not same_value(v, base)) if knob.reference is None else knob.on
            notes.append(f"the topic names only {key}={_show(value)}, the {why}: compared it with {key}={_show(other)}, "
                         "the catalog's standard alternative")
            return [value, other], other, notes
        notes.append(f"the topic names one value, {key}={_show(value)}: compared it with {key}={_show(base)}, the {why}")
        return [base, value], value, notes
    values = list(knob.first)
    notes.append(f"the topic names no values of {key}: compared the catalog's standard pair {_shows(values)}")
    return values, values[-1], notes


def _baseline(knob: catalog.Knob, task_config: JsonObject) -> tuple[Any, str]:
    """What a single named value is compared with: the off/standard value, else the task's setting."""
    if knob.reference is not None:
        return knob.reference, f"{knob.label}'s off/standard value"
    if knob.key in task_config:
        return task_config[knob.key], "task's configured value"
    return knob.first[0], "catalog's standard value (the task's configuration does not set it)"


def _capped(values: list[Any], key: str, notes: list[str]) -> list[Any]:
    if len(values) > MAX_ARMS:
        notes.append(f"a plan holds at most {MAX_ARMS} configurations: ran {key} = {_shows(values[:MAX_ARMS])}, not "
                     f"{_shows(values[MAX_ARMS:])}")
    return values[:MAX_ARMS]


def _sorted(knob: catalog.Knob, values: list[Any]) -> list[Any]:
    return sorted(values) if knob.kind in ("bool", "int", "float") else values


def _unresolved(summary: JsonObject, min_effect: float) -> tuple[Any, Any] | None:
    """The values of the last iteration's two compared arms (the history entry the planner context
    holds: the summary's comparison and its arms' ``values``) when their difference is unresolved."""
    found, values = summary.get("comparison"), summary.get("values") or {}
    if not found or not isinstance(values, dict):
        return None
    c = Comparison.model_validate(found)
    if settled(classify(c.diff, c.hw, min_effect)) or c.better not in values or c.worse not in values:
        return None
    return values[c.better], values[c.worse]
