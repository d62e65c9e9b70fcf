"""Verdicts: the rules that classify a difference, and the study's answer in words.

**The rules.** One classification of a difference, its 95% CI and the minimum effect of interest.

Equivalence-test style (two one-sided tests read off one interval), so a tiny but resolved difference
never becomes a "Yes"/"No" and an interval that fits inside ±min_effect is an answer, not a shrug:

========================================================  ==========================================
the 95% CI of the difference …                            class
========================================================  ==========================================
is missing (one seed on a side)                           Inconclusive
lies wholly inside (−min_effect, +min_effect)             No meaningful difference
contains 0 (and so reaches beyond ±min_effect)            Inconclusive (more seeds would resolve it)
excludes 0, the estimate within ±min_effect               A difference below the minimum of interest
excludes 0, the estimate beyond ±min_effect               Yes (estimate > 0) / No (estimate < 0)
========================================================  ==========================================

Boundaries: "inside" and "beyond" are strict (a CI ending exactly at ±min_effect is not inside it; an
estimate exactly at ±min_effect is not beyond it), and a CI ending exactly at 0 contains 0. The
estimate is signed the way the question asks ("larger minus smaller", "best minus runner-up"), so
"Yes" is the direction asked about. Every place that words a verdict (the report's Answer, the
offline planner's decisions, ``researcher status``) classifies with ``classify``; ``answer_class``
reads the class back from an Answer's words (the stability benchmark counts them).

**The words.** From the evidence ``researcher.evidence.analysis`` computes, this is the one place numbers
become a verdict's words ("Yes", "No", "No meaningful difference", "A difference below the minimum of
interest", "Inconclusive", a sweep's best value, a factorial's effects), so the report, ``researcher
status``, campaigns and the offline planner agree. An Answer opens with why its metric or axis is not the
registered one, when it is not.

Part of the leaf package ``findings``: the analysis that computes the evidence, the report, the
planners and campaigns all read verdicts here, and none of them is below it.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum

from researcher.findings.axes import AXIS_TEXT, AXIS_UNIT, REWARD_METRICS, primary_axis
from researcher.findings.records import (
    OK_STATUSES,
    Arm,
    Cell,
    Comparison,
    Evidence,
    IterationSummary,
    Noise,
    arm_key,
)


class Verdict(StrEnum):
    """A verdict class; its value is how an Answer's verdict sentence opens."""

    YES = "Yes"
    NO = "No"
    NO_DIFFERENCE = "No meaningful difference"
    BELOW_MINIMUM = "A difference below the minimum of interest"
    INCONCLUSIVE = "Inconclusive"


def classify(estimate: float, half_width: float | None, min_effect: float) -> Verdict:
    """The class of a difference ``estimate`` ± ``half_width`` (95% CI; None or inf: no interval)."""
    if half_width is None or not math.isfinite(half_width) or not math.isfinite(estimate):
        return Verdict.INCONCLUSIVE
    low, high = estimate - half_width, estimate + half_width
    if -min_effect < low and high < min_effect:
        return Verdict.NO_DIFFERENCE
    if low <= 0 <= high:
        return Verdict.INCONCLUSIVE
    if abs(estimate) <= min_effect:
        return Verdict.BELOW_MINIMUM
    return Verdict.YES if estimate > 0 else Verdict.NO


def resolved(verdict: Verdict) -> bool:
    """A direction is claimed: the difference is real and at least the minimum of interest."""
    return verdict in (Verdict.YES, Verdict.NO)


def settled(verdict: Verdict) -> bool:
    """More seeds of the same arms would not change the answer's kind: a direction, or none that matters."""
    return resolved(verdict) or verdict is Verdict.NO_DIFFERENCE


# A sweep's resolved answer names its best value ("Best lr=0.001 (resolved …)"): a "Yes" for that value.
_OPENINGS = sorted([(v.value, v) for v in Verdict] + [("Best", Verdict.YES)], key=lambda o: -len(o[0]))
_SENTENCE = re.compile(r"(?:^|(?<=[.!?]) )(?=[A-Z])")


def answer_class(answer: str) -> Verdict | None:
    """The class of an Answer: the first sentence that opens with a class's words (an Answer may open
    with a sentence on the axis or metric it is judged on first); None when no sentence does ("No
    answer: …", an LLM's free wording)."""
    for start in (m.end() for m in _SENTENCE.finditer(answer)):
        rest = answer[start:]
        for words, verdict in _OPENINGS:
            if rest.startswith(words) and rest[len(words):len(words) + 1] in (":", " ", ",", ""):
                if words == "No" and not rest.startswith("No:"):
                    continue  # "No answer: …", "No run …": not the class "No"
                if words == "Best" and "(resolved" not in rest.split(" — ", 1)[0]:
                    continue
                return verdict
    return None


def _est(cell: Cell | None) -> str:
    if cell is None:
        return "n/a"
    return f"{cell.mean:.3f} ± {cell.hw:.3f}" if cell.hw is not None else f"{cell.mean:.3f} (n={cell.n})"


def _ci(c: Comparison, diff: float | None = None) -> str:
    d = c.diff if diff is None else diff
    if c.hw is None and c.look is not None and c.fraction is None and c.hw95 is not None:
        return f"{d:+.3f} (the pilot decides nothing; its plain 95% CI {d - c.hw95:+.3f} to {d + c.hw95:+.3f})"
    if c.hw is None:
        return f"{d:+.3f} (one seed on a side: no interval)"
    if c.look is not None:
        return f"{d:+.3f} (95% CI at look {c.look}'s sequential boundary {d - c.hw:+.3f} to {d + c.hw:+.3f})"
    return f"{d:+.3f} (95% CI {d - c.hw:+.3f} to {d + c.hw:+.3f})"


def _orderable(values: list[object]) -> bool:
    """Distinct numbers (booleans included) read as "larger"/"smaller"; anything else by name."""
    return all(isinstance(v, (int, float)) for v in values) and len({repr(v) for v in values}) == len(values)


def seeds_text(c: Comparison, noise: Noise) -> str:
    """How many seeds per arm would resolve an unresolved comparison, and how that was estimated."""
    if c.seeds_needed is None:
        return "the seeds needed cannot be estimated yet (no configuration has 2 usable seeds)"
    spread = (f"the sd of the per-seed paired difference {c.sd:.3f}" if c.paired and c.sd is not None
              else f"the noise floor sd {(c.sd if c.sd is not None else noise.sd) or 0.0:.3f}")
    return (f"about {c.seeds_needed} seeds per arm would resolve it (it has {c.seeds}; estimated with Student t "
            f"from the observed difference {c.diff:+.3f} and {spread}: 80% power to "
            "exclude 0 if the difference is at least the minimum effect, else a CI narrow enough to fit within "
            "±minimum effect; never fewer than one seed more than it has)")


def _axes_sentence(study: Evidence) -> str:
    """Whether the measured axes agree on which of the two compared configurations leads."""
    compared = study.axes_compared
    if not compared:
        return ""
    lead = {a: (c.better_label if c.diff > 0 else c.worse_label) for a, c in compared.items() if c.diff != 0}
    parts = [f"{AXIS_TEXT[a]} {lead[a]} leads, {_ci(c)} ({classify(c.diff, c.hw, study.min_effect).lower()})"
             for a, c in compared.items() if a in lead]
    if len(set(map(repr, lead.values()))) > 1:
        return (f"The axes disagree: {'; '.join(parts)}. The verdict is {AXIS_TEXT[study.axis]}.")
    return f"The {_count(len(parts))} axes agree on the leader ({'; '.join(parts)})."


def _count(n: int) -> str:
    return {2: "two", 3: "three", 4: "four"}.get(n, str(n))


def _refinement_sentence(summaries: list[IterationSummary]) -> str:
    """How later iterations changed the picture the first one gave."""
    if len(summaries) < 2:
        return "One iteration ran: nothing was refined."
    first, last = summaries[0], summaries[-1]
    study = last.study or Evidence(knob=last.knob, metric=last.metric)
    c1 = first.iteration_comparison or first.comparison
    then = (f"iteration {first.iteration} alone had {c1.better_label} ahead of {c1.worse_label} "
            f"by {_ci(c1)}" if c1 else f"iteration {first.iteration} alone had best {first.best}")
    seeds = sum(len(r.aucs) for r in study.arms)
    c = study.comparison
    now = (f"pooling {seeds} usable runs over {len(summaries)} iterations, {c.better_label} leads "
           f"{c.worse_label} by {_ci(c)}" if c else f"the pooled best is {study.best}")
    first_best = first.study.best_value if first.study else None
    changed = " — the best configuration changed" if first_best != study.best_value else ""
    return f"How refinement changed the picture: {then}; {now}{changed}."


def _effects_answer(study: Evidence) -> str:
    """A factorial study's answer: its resolved effects first, then every effect with its interval."""
    effects = [e for e in study.effects if e.estimate is not None]
    shown = [f"{e.name} {e.estimate:+.3f}" + (f" (95% CI {e.low:+.3f} to {e.high:+.3f})" if e.hw is not None
                                              else " (no interval)") for e in effects]
    named = [e.name for e in effects if resolved(classify(e.estimate or 0.0, e.hw, study.min_effect))]
    lead = (f"Resolved: {', '.join(named)} (their 95% CIs exclude 0 and their estimates exceed ±{study.min_effect})"
            if named else f"Inconclusive: no main effect or interaction is resolved (no 95% CI both excludes 0 and "
                          f"has its estimate beyond ±{study.min_effect})")
    return (f"{lead} — factorial effects on the area under the `{study.metric}` curve "
            f"{AXIS_TEXT[study.axis]}: {'; '.join(shown)}.")


def verdict(question: str, summaries: list[IterationSummary]) -> tuple[str, str]:
    """(answer, caveats) worded from the whole study's pooled evidence, on the knob's primary axis."""
    scored = [s for s in summaries if s.best and s.study]  # "study": summaries since issue #16
    if not scored or scored[-1].study is None:
        return ("No answer: no run produced a usable reward curve (see LOG.md for the crashes).",
                "Every run crashed, stalled or was cut before 3 training steps.")
    study = scored[-1].study
    axis = study.axis
    rows = sorted((r for r in study.arms if r.scored), key=lambda r: r.axes[axis].mean, reverse=True)
    noise = study.noise_floor[axis]
    floor = (f"Noise floor (pooled within-configuration sd of the AUC {AXIS_TEXT[axis]}): "
             + (f"{noise.sd:.4f}, from {noise.seeds} seeds in {noise.arms} configurations" if noise.sd is not None
                else "not measured (no configuration has 2 usable seeds)") + f"; minimum effect: {study.min_effect}.")
    caveats = [study.metric_note, f"Learning speed is {study.axis_why}.", floor]
    if len(rows) < 2:
        return (f"Inconclusive: only {rows[0].label} produced usable runs "
                f"(AUC {_est(rows[0].axes[axis])}).",
                " ".join([*caveats, "A comparison needs at least two configurations with results."]))
    if study.effects:
        return _with_switch(study, _effects_answer(study)), " ".join(caveats)
    c = study.comparison
    assert c is not None  # two scored arms are always compared
    if study.short:
        answer = (f"Inconclusive: {study.short} No verdict is drawn from fewer points; longer runs (or a later "
                  "iteration's) would give every arm its window — " + _pair_evidence(study, rows, c) + ".")
    else:
        answer = _sweep_answer(study, rows, c) if study.sweep else _pair_answer(study, rows, c)
    answer = _with_switch(study, answer)
    caveats.append(_axes_sentence(study))
    caveats.append(_refinement_sentence(scored))
    for s in scored[1:]:
        ic = s.iteration_comparison
        detail = (f"{ic.better} − {ic.worse} = {_ci(ic)}" + (" (clear)" if ic.clear else " (CI includes 0)")
                  if ic else f"best was {s.best}")
        caveats.append(f"Iteration {s.iteration} alone (over {s.horizon} steps): {detail}"
                       + (f"; {s.plateau}" if s.plateau else "") + ".")
    bad = [st for s in summaries for r in s.experiments for st in r.statuses if st not in OK_STATUSES]
    if bad:
        caveats.append(f"{len(bad)} run(s) did not finish cleanly ({', '.join(sorted(set(bad)))}); they are "
                       "excluded from the statistics.")
    return answer, " ".join(c for c in caveats if c)


def _over(study: Evidence) -> str:
    axis = study.axis
    return f"{study.budgets[axis]:.0f} {AXIS_UNIT[axis]}" if axis != "step" else f"{study.horizon} steps"


def _seeds(rows: list[Arm]) -> str:
    return ", ".join(f"{r.label}: {len(r.aucs)}" for r in rows)


def _with_switch(study: Evidence, answer: str) -> str:
    """``answer`` opened by why its metric or axis is not the registered one (whoever worded it)."""
    if not study.switch or answer.startswith(study.switch):
        return answer
    return f"{study.switch} {answer}"


def _sweep_answer(study: Evidence, rows: list[Arm], c: Comparison) -> str:
    knob, axis, noise = study.knob, study.axis, study.noise_floor[study.axis]
    best, runner = rows[0], rows[1]
    evidence = (f"area under the `{study.metric}` curve {AXIS_TEXT[axis]} over {_over(study)}: best {knob}={best.value} "
                f"{_est(best.axes[axis])}, runner-up {knob}={runner.value} {_est(runner.axes[axis])}; "
                f"difference {_ci(c)}; seeds {_seeds(rows)}")
    verdict = classify(c.diff, c.hw, study.min_effect)  # best − runner-up: never below 0
    if resolved(verdict):
        return f"Best {knob}={best.value} (resolved against the runner-up) — {evidence}."
    if verdict is Verdict.NO_DIFFERENCE:
        return (f"No meaningful difference between the best values: {knob}={best.value} and "
                f"{knob}={runner.value} lie within ±{study.min_effect} — {evidence}.")
    if verdict is Verdict.BELOW_MINIMUM:
        return (f"{verdict}: {knob}={best.value} beat the runner-up {knob}={runner.value} by less than "
                f"{study.min_effect}, so no best value is claimed — {evidence}.")
    return (f"Inconclusive: {knob}={best.value} scored highest but is not resolved against the runner-up "
            f"(the 95% CI of the difference includes 0), so no best value is claimed; "
            f"{seeds_text(c, noise)} — {evidence}.")


def _ordered(study: Evidence, rows: list[Arm], c: Comparison) -> tuple[Arm, Arm, float, bool]:
    """The compared pair as (high, low, high − low, orderable): by the knob's value where it is a number,
    else (better, worse)."""
    pair = [r for r in rows if r.name in (c.better, c.worse)]
    orderable = _orderable([r.value for r in pair])
    high, low = sorted(pair, key=lambda r: r.value, reverse=True) if orderable else pair
    return high, low, (c.diff if high.name == c.better else -c.diff), orderable


def _pair_evidence(study: Evidence, rows: list[Arm], c: Comparison) -> str:
    high, low, d, _ = _ordered(study, rows, c)
    axis = study.axis
    return (f"area under the `{study.metric}` curve {AXIS_TEXT[axis]} over {_over(study)}: {high.label} "
            f"{_est(high.axes[axis])} vs {low.label} {_est(low.axes[axis])}; {_final_word(study)} "
            f"{_est(high.final)} vs {_est(low.final)}; difference {_ci(c, d)}; seeds {_seeds(rows)}")


def _final_clause(study: Evidence, ahead: Arm, behind: Arm) -> str:
    """Why the arm behind on the verdict axis can end with the higher final reward, in one clause
    ("" when it does not): the final reward is read at the end of each run's own steps, the verdict
    over the window every arm reached, or over the whole curve where a late riser ends higher."""
    if ahead.final is None or behind.final is None or behind.final.mean <= ahead.final.mean:
        return ""
    axis = study.axis
    if axis == "step":
        why = (f"the verdict weighs each whole curve over {study.horizon} steps and {behind.label} rose later, "
               "while the final reward is the mean of the last 5 points")
    else:
        unit = AXIS_UNIT[axis]
        why = (f"the final reward is read after each run's own {study.horizon} steps, by which {behind.label} had "
               f"used {behind.reach.get(axis, 0):.0f} {unit} against {ahead.reach.get(axis, 0):.0f}, while the "
               f"verdict compares both over the first {study.budgets[axis]:.0f} {unit}")
    return (f"; {behind.label} ends with the higher {_final_word(study)} ({behind.final.mean:.3f} vs "
            f"{ahead.final.mean:.3f}) because {why}")


def _moved(study: Evidence, up: bool) -> str:
    """How an arm ahead (``up``) or behind moved: learning speed for a reward, else the metric's height
    (clip-higher is judged on entropy, Dr. GRPO on the length of wrong answers: neither "learns")."""
    if study.metric in REWARD_METRICS:
        return f"learned {'faster' if up else 'slower'}"
    return f"kept `{study.metric}` {'higher' if up else 'lower'}"


def _final_word(study: Evidence) -> str:
    return "final reward" if study.metric in REWARD_METRICS else f"final `{study.metric}`"


def _pair_answer(study: Evidence, rows: list[Arm], c: Comparison) -> str:
    knob, axis, noise = study.knob, study.axis, study.noise_floor[study.axis]
    high, low, d, orderable = _ordered(study, rows, c)
    evidence = _pair_evidence(study, rows, c)
    verdict = classify(d, c.hw, study.min_effect)  # signed the way the question asks: larger − smaller
    ahead, behind = (high, low) if d >= 0 else (low, high)
    clause = _final_clause(study, ahead, behind)
    who = f"the larger {knob} ({high.value})" if orderable else f"{high.label} (vs {low.label})"
    if resolved(verdict) and arm_key(high.overrides) == arm_key(low.overrides):
        same = ", ".join(f"{k}={v}" for k, v in high.overrides.items()) or "the task's configuration"
        return (f"Yes: {ahead.name} learned faster than {behind.name} {AXIS_TEXT[axis]}, though both run the "
                f"identical configuration ({same}): a false positive (expected in 5% of such checks) or a "
                f"source of difference outside the configuration{clause} — {evidence}.")
    if verdict is Verdict.NO_DIFFERENCE:
        return (f"No meaningful difference: the whole 95% CI of the difference lies within ±{study.min_effect}"
                f"{clause} — {evidence}.")
    if verdict is Verdict.BELOW_MINIMUM:
        return (f"{verdict}: {who} {_moved(study, d > 0)} {AXIS_TEXT[axis]} (the 95% CI "
                f"excludes 0), but by less than the minimum effect {study.min_effect}, so neither Yes nor No"
                f"{clause} — {evidence}.")
    if resolved(verdict):
        return f"{verdict}: {who} {_moved(study, d > 0)} {AXIS_TEXT[axis]}{clause} — {evidence}."
    return (f"Inconclusive: {c.better_label} was ahead on average but the 95% CI of the "
            f"difference includes 0; {seeds_text(c, noise)}{clause} — {evidence}.")


_AXIS_WORDS = {"step": re.compile(r"\bper (training )?step"), "episode": re.compile(r"\bper episode"),
               "second": re.compile(r"\bper (wall-clock )?second|\bwall-clock"),
               "token": re.compile(r"\bper (generated )?token")}


def asked_axes(question: str) -> list[str]:
    """The axes a question mentions ("per step", "per episode consumed", …), in AXES order."""
    return [a for a, words in _AXIS_WORDS.items() if words.search(question)]


def question_with_axis(question: str, knob: str) -> str:
    """``question`` stating the axis its verdict will be judged on (the knob's primary axis), so the
    report's Question line asks what its Answer answers, whoever framed it (an LLM planner too): a
    question silent on the axis gets it appended; one naming another axis gets the verdict's, and why."""
    axis, why = primary_axis(knob)
    if AXIS_TEXT[axis] in question:
        return question
    if asked_axes(question):
        return f"{question.rstrip()} (The verdict is {why}.)"
    return f"{question.rstrip().rstrip('?').rstrip()}, judged {AXIS_TEXT[axis]}?"


def answer_naming_axes(question: str, study: Evidence | None, answer: str) -> str:
    """``answer``, opened by a sentence naming both axes when the question does not state the
    verdict's axis (it names another, or none): the headline never silently answers another question."""
    if study is None or not study.axis:
        return answer
    if study.switch:
        return _with_switch(study, answer)
    axis = study.axis
    if AXIS_TEXT[axis] in question or (not asked_axes(question) and AXIS_TEXT[axis] in answer.split(". ")[0]):
        return answer
    said = " and ".join(AXIS_TEXT[a] for a in asked_axes(question)) or "no axis"
    return (f"Judged {AXIS_TEXT[axis]}, while the question says {said} (learning speed is {study.axis_why}). "
            f"{answer}")
