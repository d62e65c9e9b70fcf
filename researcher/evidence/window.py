"""The window a verdict compares arms over, and whether every arm has the evidence for it.

A comparison on an axis (per step, per episode consumed) reads each run's curve up to the budget every
run reached on that axis. Per episode, a configuration that consumes 4x the episodes a step reaches that
budget 4x sooner, so it may have only two held-out rounds inside it (steps 0 and 5): a verdict from two
points. ``judged_axis`` keeps the registered axis only where every arm has ``MIN_ROUNDS`` points of the
metric inside its window; else it moves to the axis that has them and says why in a sentence the Answer
opens with; where none has, no verdict is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from researcher.findings.axes import AXIS_TEXT, AXIS_UNIT
from researcher.findings.records import Arm

MIN_ROUNDS = 4  # points of the metric every arm needs inside the window a verdict compares (never two points)
JUDGED_AXES = ("step", "episode")  # wall-clock is never judged: runs share the CPU cores


def points_inside(xs: Sequence[float], budget: float) -> int:
    """How many points of a curve (its x values on one axis) lie inside the window ``[0, budget]``."""
    return sum(1 for x in xs if x <= budget + 1e-9)


def points_word(metric: str, n: int = 2) -> str:
    """What ``n`` points of ``metric`` are, in words: held-out rounds or training steps' batches."""
    if metric.startswith("eval/"):
        return "held-out evaluation round" + ("s" if n != 1 else "")
    return ("step" if n == 1 else "steps") + f" with a `{metric}` value"


def judged_axis(rows: Sequence[Arm], measured: Sequence[str], metric: str, budgets: Mapping[str, float],
                 registered: tuple[str, str]) -> tuple[str, str, str, str]:
    """(axis, why, switch, short): the registered axis when every scored arm has ``MIN_ROUNDS`` points of
    ``metric`` inside its window, else the first judged axis that has them (``switch`` says why in a
    sentence); ``short`` (non-empty) when none has: no verdict then, whatever the intervals say."""
    axis, why = registered
    scored = [r for r in rows if r.scored]
    enough = {a: all(r.rounds.get(a, 0) >= MIN_ROUNDS for r in scored) for a in measured}
    if enough.get(axis) or not scored:
        return axis, why, "", ""
    if axis not in measured:
        reason = f"the runs record no {AXIS_UNIT[axis]} to judge on"
    else:
        thin = min(scored, key=lambda r: r.rounds.get(axis, 0))
        n = thin.rounds.get(axis, 0)
        reason = (f"within the {budgets[axis]:.0f} {AXIS_UNIT[axis]} every run reached, {thin.label} has only {n} "
                  f"{points_word(metric, n)} (at least {MIN_ROUNDS} needed)")
    other = next((a for a in JUDGED_AXES if a != axis and enough.get(a)), None)
    if other is None:
        shown = axis if axis in measured else "step"  # the numbers shown, though no verdict is drawn
        return shown, why, "", (f"No verdict {AXIS_TEXT[axis]}: {reason}, and no other axis has {MIN_ROUNDS} "
                                f"{points_word(metric)} for every arm either.")
    fewest = min(r.rounds[other] for r in scored)
    return other, f"judged {AXIS_TEXT[other]} (the registered {AXIS_TEXT[axis]} lacks the evidence)", (
        f"Judged {AXIS_TEXT[other]}, not {AXIS_TEXT[axis]} as registered: {reason}; {AXIS_TEXT[other]} every arm "
        f"has at least {fewest}."), ""
