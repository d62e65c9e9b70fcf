"""Read a research topic as a researcher would: which task, which knob, which values, which shape.

"Does a KL coefficient of 0.05 beat 0.2 on digits?" names a task (digits), a knob (``kl_coef``),
two values to run exactly (0.05 and 0.2) and a shape: a controlled comparison of those arms. "How
does the learning rate affect letters?" names a knob and asks for a dose-response sweep. Both
planners use this one reading: the offline planner runs exactly what ``parse`` finds, and the plan
node checks an LLM's plan against it (``plan_complaint``) before anything runs.

An A/A topic ("A/A check: do two identical configurations of letters learn at different speeds?")
asks for two arms with the identical configuration under different names (``identical``): the
difference between them is noise, so the study measures the noise floor and must never answer "Yes".

It reads the catalog's keywords and numbers, not language: a number belongs to the knob named
closest before it (or after it, when none is named before), a value phrase ("token-level",
"with and without") to the knob being varied. What it had to assume (a value out of the knob's
range, an unknown task, no task named) it says in ``assumptions``, which end up in plan.json.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from researcher.planner import catalog
from researcher.types.design import DATA_TASK, same_value

Shape = Literal["comparison", "sweep"]
MIN_SWEEP = 4  # a dose-response curve needs at least this many values of the knob
IDENTICAL_KNOB = "lr"  # what an A/A check that names no knob reports under (every task configures it)

_NUMBER = re.compile(r"(?<![\w.])(?<![a-z]-)(\d+(?:\.\d+)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?)(?!\w|\.\d)")
# Numbers that count something else ("30 steps", "3 seeds", "8m") name no knob value.
_UNIT = re.compile(r"\s*(?:%|percent\b|x\b|×|times\b|(?:steps?|seeds?|runs?|minutes?|mins?|hours?|hrs?|seconds?|"
                   r"secs?|iterations?|epochs?|tokens?|prompts?|episodes?|gpus?|cpus?|cores?|workers?|replicas?)\b)")
_SWEEP = re.compile(r"\bhow (?:does|do|did|will|would|much|many|far|strongly|sensitive)\b|\bwhat(?:'s| is| are)? "
                    r"(?:the )?(?:best|optimal|ideal|right)\b|\b(?:best|optimal|optimum)\b|\baffects?\b|\beffects? of\b|"
                    r"\bsweep\b|\bas a function of\b|\bscales? with\b|\bdose[- ]response\b|\bsensitiv\w*|\bcurve\b|"
                    r"\btun(?:e|ing)\b|\bacross\b|\brange\b")
_IDENTICAL = re.compile(r"(?<![a-z0-9_])a/a(?![a-z0-9_])|\ba-a (?:test|check)|\baa (?:test|check)|\bidentical "
                        r"(?:arms?|configurations?|configs?|runs?|setups?|settings?|experiments?)\b|\bsame "
                        r"(?:configuration|config|setup|settings?|experiment)s? (?:twice|two times)\b")
# An open question names no knob and asks what helps: "What makes the letters task learn faster?"
_OPEN = re.compile(r"^\s*(?:what|which)\b.*\b(?:learn\w*|help\w*|speeds?|faster|improv\w*|matters?|knobs?|settings?)\b")
# What a comparison asks of its subject (the first value it names) against the other: a higher metric (the
# default: "beat", "learn faster"), a lower one ("Does a KL coefficient of 0.2 slow learning…?", "…keep wrong
# answers shorter…?"), the same ("Does a group size of 2 match 8?") or any difference ("Does X change…?").
# Read only after the knob's first mention, so an adjective naming the subject ("Does a lower lr of 1e-4 beat
# 1e-3?") is not taken for the effect asked about.
Asks = Literal["higher", "lower", "same", "different"]
_ASKS: tuple[tuple[Asks, re.Pattern[str]], ...] = (
    ("same", re.compile(r"\b(?:match(?:es)?|equals?|same as|as (?:good|well|fast) as|on par with)\b")),
    ("lower", re.compile(r"\b(?:slow(?:s|er|ing)?|hurts?|harms?|worse|shorter|lowers|reduc(?:e|es|ing)|"
                         r"decreas(?:e|es|ing)|shrinks?|delays?|degrad(?:e|es|ing))\b")),
    ("different", re.compile(r"\b(?:change|changes|differ|differs|different|affects?|matters?)\b")),
)
_RANGE_GAP = re.compile(r"\s*(?:to|-|through|up to|and)\s*")
_UNKNOWN_TASK = (re.compile(r"\bthe ([a-z][a-z0-9_-]*) (?:task|benchmark|dataset|environment)\b"),
                 re.compile(r"\b(?:task|benchmark|dataset) (?:called |named )?['\"]?([a-z][a-z0-9_-]*)"),
                 re.compile(r"\bon (?:the )?([a-z][a-z0-9_-]*)\s*[?.!]*\s*$"))
_NOT_TASKS = {"average", "it", "this", "that", "them", "cpu", "gpu", "time", "policy", "learning", "training",
              "purpose", "top", "paper", "reward", "rewards", "speed", "convergence", "stability", "model", "same",
              "task", "tasks", "results", "performance",
              "learn", "learns", "train", "trains", "improve", "improves"}  # "the data task learn faster"


@dataclass(frozen=True)
class TopicQuestion:
    """What a topic asks: the knob it varies, the values and task it names, and its shape."""

    text: str
    knob: str | None                 # catalog key; None when the topic names no knob
    task: str                        # the example task to run (named, forced by the knob, or the default)
    task_named: bool                 # the topic itself decides the task
    values: tuple[Any, ...] = ()     # the knob values the topic names, runnable, in the order named
    shape: Shape = "comparison"      # "A vs B" / "does X help" vs "how does X affect Y" / "best X"
    span: bool = False               # two named values are the ends of a range to sweep ("from 2 to 32")
    fixed: Mapping[str, Any] = field(default_factory=dict)  # other knobs the topic pins ("at lr 1e-3")
    assumptions: tuple[str, ...] = ()
    identical: bool = False          # an A/A check: two arms of one configuration, different names
    open: bool = False               # an open question naming no knob ("what makes X learn faster?"): a screen
    asks: Asks = "higher"            # what a comparison asks of its first-named value against the other

    def summary(self) -> dict[str, Any]:
        """The reading as plain data (planner context, plan.json)."""
        return {"knob": self.knob, "task": self.task, "task_named": self.task_named, "values": list(self.values),
                "shape": self.shape, "span": self.span, "fixed": dict(self.fixed),
                "identical": self.identical, "open": self.open, "asks": self.asks, "assumptions": list(self.assumptions)}


@dataclass(frozen=True)
class _Hit:
    start: int
    end: int
    length: int
    item: Any


def parse(topic: str) -> TopicQuestion:
    """Read ``topic`` (any text); never raises. ``knob`` is None when no catalog knob is named."""
    text = _normalise(topic)
    mentions = _hits(text, [(phrase, item) for item in catalog.KNOBS for phrase in item.phrases])
    task, task_named, assumptions = _task(text, None)
    identical = _IDENTICAL.search(text) is not None
    if not mentions and identical:
        assumptions.append(f"an A/A check names no knob: both arms run the {task} task's configuration and are "
                           f"reported under {IDENTICAL_KNOB}, set to the same value in both")
        return TopicQuestion(topic, IDENTICAL_KNOB, task, task_named, assumptions=tuple(assumptions), identical=True)
    if not mentions:
        return TopicQuestion(topic, None, task, task_named, assumptions=tuple(assumptions),
                             open=_OPEN.search(text) is not None)
    numbers, stray = _numbers(text, mentions)
    knob = _primary(mentions, numbers)
    task, task_named, assumptions = _task(text, knob)
    values, tokens = _named_values(text, knob, numbers)
    if stray:
        assumptions.append(f"ignored {_fmt_list(stray)}: no knob value the researcher can place")

    runnable: list[Any] = []
    for value in values:
        fitted, note = fit(knob, value)
        if note:
            assumptions.append(note)
        if not any(same_value(fitted, v) for v in runnable):
            runnable.append(fitted)
    fixed: dict[str, Any] = {}
    for item, found in numbers.items():
        if item is knob or not found:
            continue
        if len(found) == 1:
            fixed[item.key], note = fit(item, found[0][0])
            if note:
                assumptions.append(note)
        else:
            assumptions.append(f"the topic also names {item.key} = {_fmt_list([v for v, _ in found])}; a study varies "
                               f"one knob, so {item.key} stays at the task's configured value")

    if identical:
        if len(runnable) > 1:
            assumptions.append(f"an A/A check runs one configuration twice: both arms run {knob.key} = "
                               f"{_fmt(runnable[0])}, not {_fmt_list(runnable[1:])}")
        return TopicQuestion(topic, knob.key, task, task_named, tuple(runnable[:1]), "comparison", False, fixed,
                             tuple(assumptions), identical=True)
    sweep_cue = _SWEEP.search(text) is not None
    span = sweep_cue and len(runnable) == 2 and len(tokens) == 2 and _is_range(text, tokens)
    shape: Shape = "sweep" if sweep_cue and (len(runnable) != 2 or span) else "comparison"
    asks: Asks = next((kind for kind, words in _ASKS if words.search(text, mentions[0].start)), "higher")
    return TopicQuestion(topic, knob.key, task, task_named, tuple(runnable), shape, span, fixed, tuple(assumptions),
                         asks=asks)


def fit(knob: catalog.Knob, value: Any) -> tuple[Any, str | None]:
    """``value`` as the knob can run it (an int for int knobs, clamped into its range) and a note
    saying what was changed and why (None when nothing was)."""
    if knob.kind not in ("int", "float") or not isinstance(value, (int, float)) or isinstance(value, bool):
        return value, None
    fitted: Any = value
    notes = []
    if knob.kind == "int" and float(value) != round(value):
        fitted = round(value)
        notes.append(f"{knob.key} takes whole numbers: read {value:g} as {fitted}")
    elif knob.kind == "int":
        fitted = int(value)
    else:
        fitted = float(value)
    if knob.bounds is not None:
        low, high = knob.bounds
        clamped = min(max(fitted, type(fitted)(low)), type(fitted)(high))
        if clamped != fitted:
            notes.append(f"{knob.key} = {fitted:g} is outside the range the researcher runs ({low:g} to {high:g}); "
                         f"ran {clamped:g}, the nearest value in range")
            fitted = clamped
    return fitted, "; ".join(notes) or None


def framing_complaint(question: TopicQuestion, knob: str, task: str) -> str | None:
    """Why a framing (knob, task) does not frame the topic's question; None when it does."""
    problems = []
    if question.values and question.knob != knob:
        problems.append(f"the topic names values of `{question.knob}` ({_fmt_list(question.values)}), so the knob "
                        f"to vary is `{question.knob}`, not `{knob}`")
    if question.task_named and question.task != task:
        problems.append(f"the topic is about the {question.task} task: frame it on `{question.task}`, not `{task}`")
    return "; ".join(problems) + "." if problems else None


def plan_complaint(question: TopicQuestion, knob: str, arms: Sequence[Mapping[str, Any]], tested: Sequence[Any] = (),
                   room: int = 8) -> str | None:
    """Why a plan does not test the topic's question; None when it does.

    ``arms`` are the experiments' overrides, ``knob`` the framed knob, ``tested`` the values of it
    earlier iterations ran (a named value run before need not run again) and ``room`` how many
    configurations the run budget fits (a sweep is not asked for more).
    """
    if question.knob is None:
        return None
    if question.identical:
        return _identical_complaint(question, arms)
    problems = []
    named = question.values if question.knob == knob else ()
    if question.values and question.knob != knob:
        problems.append(f"the topic names values of `{question.knob}` but the study varies `{knob}`")
    unset = [str(i + 1) for i, overrides in enumerate(arms) if knob not in overrides]
    if unset and (named or question.fixed or question.shape == "sweep"):
        problems.append(f"every experiment must set `{knob}` explicitly in its overrides (experiment(s) "
                        f"{', '.join(unset)} do not)")
    ran = _distinct([overrides[knob] for overrides in arms if knob in overrides])
    missing = [v for v in named if not any(same_value(v, r) for r in [*ran, *tested])]
    if missing:
        problems.append(f"the topic names {knob} = {_fmt_list(named)}, and each must be run exactly as named; the "
                        f"plan drops {knob} = {_fmt_list(missing)} (it runs {knob} = {_fmt_list(ran) or 'nothing'})")
    for key, value in question.fixed.items():
        if any(not same_value(overrides.get(key), value) for overrides in arms):
            problems.append(f"the topic fixes {key} = {_fmt(value)}: set it in every experiment's overrides")
    if question.shape == "sweep" and not tested and question.knob == knob:
        item = catalog.knob(knob)
        possible = len(item.ladder) if item.kind in ("bool", "choice") else MIN_SWEEP
        want = min(MIN_SWEEP, possible, max(room, 2))
        if named and not question.span:
            want = min(want, len(named))
        if len(ran) < want:
            where = f" across its range {item.bounds[0]:g} to {item.bounds[1]:g}" if item.bounds else ""
            problems.append(f"the topic asks how {knob} affects learning: a dose-response sweep needs at least {want} "
                            f"distinct values of `{knob}`{where}; the plan runs {len(ran)}")
    return "; ".join(problems) + "." if problems else None


def _identical_complaint(question: TopicQuestion, arms: Sequence[Mapping[str, Any]]) -> str | None:
    """An A/A check: at least two arms, every one with the same configuration, holding what the topic names."""
    problems = []
    if len(arms) < 2:
        problems.append(f"an A/A check compares two arms with the identical configuration under different names; "
                        f"the plan has {len(arms)}")
    varied = sorted({key for overrides in arms for key in {*overrides, *arms[0]}
                     if not same_value(overrides.get(key), arms[0].get(key))})
    if varied:
        problems.append(f"an A/A check runs the identical configuration in every arm, but the plan varies "
                        f"{', '.join(f'`{k}`' for k in varied)}: give every experiment the same overrides")
    pinned: dict[str, Any] = dict(question.fixed)
    if question.knob is not None and question.values:
        pinned[question.knob] = question.values[0]
    for key, value in pinned.items():
        if any(not same_value(overrides.get(key), value) for overrides in arms):
            problems.append(f"the topic sets {key} = {_fmt(value)}: set it in every experiment's overrides")
    return "; ".join(problems) + "." if problems else None


# ---------------------------------------------------------------------- reading


def _normalise(topic: str) -> str:
    text = topic.lower().replace("\u2013", "-").replace("\u2014", "-").replace("\u2212", "-")
    return text.replace("\u2019", "'").replace("\u00d7", "×")


def _pattern(phrase: str) -> str:
    return rf"(?<![a-z0-9_]){re.escape(phrase)}(?:s|es)?(?![a-z0-9_])"


def _hits(text: str, phrases: Sequence[tuple[str, Any]]) -> list[_Hit]:
    """Non-overlapping matches in text order; where two overlap, the longer phrase wins."""
    found = [_Hit(m.start(), m.end(), len(phrase), item)
             for phrase, item in phrases for m in re.finditer(_pattern(phrase), text)]
    kept: list[_Hit] = []
    for hit in sorted(found, key=lambda h: (-h.length, h.start)):
        if all(hit.end <= k.start or hit.start >= k.end for k in kept):
            kept.append(hit)
    return sorted(kept, key=lambda h: h.start)


def _numbers(text: str, mentions: list[_Hit]) -> tuple[dict[catalog.Knob, list[tuple[Any, _Hit]]], list[str]]:
    """Each number, given to the numeric knob named closest before it (else closest after it)."""
    owned: dict[catalog.Knob, list[tuple[Any, _Hit]]] = {}
    stray: list[str] = []
    for m in _NUMBER.finditer(text):
        if _UNIT.match(text, m.end()) or any(h.start <= m.start() < h.end for h in mentions):
            continue
        raw = m.group(1)
        value: Any = int(raw) if raw.isdigit() else float(raw)
        token = _Hit(m.start(), m.end(), 0, value)
        accepting = [h for h in mentions if _accepts(h.item, value)]
        before = [h for h in accepting if h.end <= m.start()]
        after = [h for h in accepting if h.start >= m.end()]
        owner = before[-1] if before else (after[0] if after else None)
        if owner is None:
            stray.append(raw)
            continue
        found = owned.setdefault(owner.item, [])
        if not any(same_value(value, v) for v, _ in found):
            found.append((value, token))
    return owned, stray


def _accepts(knob: catalog.Knob, value: Any) -> bool:
    if knob.kind == "float":
        return True
    return knob.kind == "int" and float(value) == round(value)


def _primary(mentions: list[_Hit], numbers: dict[catalog.Knob, list[tuple[Any, _Hit]]]) -> catalog.Knob:
    """The varied knob: the one with the most named values when some knob has two or more, else the
    one named by the longest phrase (the earliest on a tie)."""
    most = max((len(v) for v in numbers.values()), default=0)
    if most >= 2:
        return next(h.item for h in sorted(mentions, key=lambda h: -h.length) if len(numbers.get(h.item, [])) == most)
    return min(mentions, key=lambda h: (-h.length, h.start)).item


def _named_values(text: str, knob: catalog.Knob,
                  numbers: dict[catalog.Knob, list[tuple[Any, _Hit]]]) -> tuple[list[Any], list[_Hit]]:
    """The knob's values in the order the topic names them, and the number tokens they came from."""
    named: list[tuple[int, Any]] = [(tok.start, v) for v, tok in numbers.get(knob, [])]
    tokens = [tok for _, tok in numbers.get(knob, [])]
    if knob.aliases:
        named += [(h.start, h.item) for h in _hits(text, list(knob.aliases))]
    if knob.reference is not None:
        # "without KL", "no KL", "KL off" name the off value exactly; "with KL" names no number, so
        # the on arm is the planner's choice (an assumption), not a named value.
        words = "|".join(re.escape(p) for p in knob.phrases)
        off = re.search(rf"\bwith(?:out)? (?:and|or|vs\.?|versus) without\b|\b(?:without|no) (?:[\w-]+ ){{0,2}}?"
                        rf"(?:{words})\b|\b(?:{words}) (?:off|disabled)\b", text)
        if off:
            named.append((off.start(), knob.reference))
    ordered: list[Any] = []
    for _, value in sorted(named, key=lambda pair: pair[0]):
        if not any(same_value(value, v) for v in ordered):
            ordered.append(value)
    return ordered, tokens


def _is_range(text: str, tokens: list[_Hit]) -> bool:
    """"from 2 to 32", "between 1e-4 and 1e-2", "2-32": the two numbers bound a range."""
    first, second = sorted(tokens, key=lambda t: t.start)
    gap = text[first.end:second.start]
    if not _RANGE_GAP.fullmatch(gap):
        return False
    return gap.strip() != "and" or re.search(r"\bbetween\s*$", text[:first.start]) is not None


def _task(text: str, knob: catalog.Knob | None) -> tuple[str, bool, list[str]]:
    """The task to run, whether the topic decides it, and what had to be assumed."""
    named = next((name for name, words in catalog.TASK_KEYWORDS.items() if _hits(text, [(w, name) for w in words])),
                 None)
    notes: list[str] = []
    if knob is not None and knob.task is not None:
        if named is not None and named != knob.task:
            notes.append(f"{knob.key} only exists on the {knob.task} task, so the study runs {knob.task}, not {named}")
        return knob.task, True, notes
    if named is not None:
        return named, True, notes
    # "the data task" is the user's own data (``on_task`` says so), not an unknown example.
    unknown = next((m.group(1) for p in _UNKNOWN_TASK for m in [p.search(text)] if m and m.group(1) not in _NOT_TASKS
                    and m.group(1) != DATA_TASK
                    and not _hits(m.group(1), [(ph, k) for k in catalog.KNOBS for ph in k.phrases])), None)
    known = ", ".join(sorted(catalog.TASK_KEYWORDS))
    if unknown:
        notes.append(f"the topic names the task {unknown!r}, which is not an example study (known: {known}); ran "
                     f"{catalog.DEFAULT_TASK}, the default")
    else:
        notes.append(_DEFAULT_TASK_NOTE)
    return catalog.DEFAULT_TASK, False, notes


_DEFAULT_TASK_NOTE = f"the topic names no task; ran {catalog.DEFAULT_TASK}, the default example study"


def on_task(question: TopicQuestion, task: str) -> TopicQuestion:
    """The reading of a topic that names no task, run on ``task`` (the study's own data) instead of the
    default example: its note then says so rather than that the default ran."""
    if question.task_named or task == question.task:
        return question
    notes = [n for n in question.assumptions if n != _DEFAULT_TASK_NOTE]
    notes.append(f"the topic names no example task; ran the study's own {task} task")
    return dataclasses.replace(question, task=task, assumptions=tuple(notes))


def _distinct(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if not any(same_value(value, v) for v in out):
            out.append(value)
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _fmt_list(values: Sequence[Any]) -> str:
    shown = [_fmt(v) for v in values]
    if len(shown) < 2:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]
