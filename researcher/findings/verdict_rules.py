"""The verdict rules: one classification of a difference, its 95% CI and the minimum effect of interest.

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
"""

from __future__ import annotations

import math
import re
from enum import StrEnum

__all__ = ["Verdict", "answer_class", "classify", "resolved", "settled"]


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
