"""The verdict rules as a truth table: (estimate, 95% CI half width, minimum effect) → class, with the
boundaries, a missing interval (one seed on a side) and the Answer openings read back as classes."""

from __future__ import annotations

import math

import pytest

from researcher.findings.verdicts import Verdict, answer_class, classify, resolved, settled

Y, N, EQ, BELOW, INC = Verdict.YES, Verdict.NO, Verdict.NO_DIFFERENCE, Verdict.BELOW_MINIMUM, Verdict.INCONCLUSIVE


@pytest.mark.parametrize(("estimate", "hw", "min_effect", "expected"), [
    # the whole CI inside ±min_effect
    (0.0, 0.01, 0.02, EQ),
    (0.005, 0.01, 0.02, EQ),          # CI [-0.005, 0.015]
    (-0.008, 0.01, 0.02, EQ),         # the README's first answer: CI [-0.018, 0.002]
    (0.015, 0.004, 0.02, EQ),         # excludes 0 but fits inside: still no meaningful difference
    (0.0, 0.0, 0.02, EQ),             # identical runs
    # boundaries of "inside": strict (binary fractions, so the interval's ends are exact)
    (0.125, 0.125, 0.25, INC),        # CI [0, 0.25]: touches +min_effect (not inside) and contains 0
    (0.1875, 0.0625, 0.25, BELOW),    # CI [0.125, 0.25]: ends at +min_effect, excludes 0, estimate inside
    (-0.1875, 0.0625, 0.25, BELOW),
    (0.0, 0.25, 0.25, INC),           # CI [-0.25, 0.25]: exactly ±min_effect is not inside it
    # CI contains 0 and reaches beyond ±min_effect
    (0.01, 0.03, 0.02, INC),
    (-0.03, 0.04, 0.02, INC),
    (0.05, 0.05, 0.02, INC),          # CI ends exactly at 0: contains it
    (0.0, 0.5, 0.02, INC),
    # CI excludes 0, the estimate inside ±min_effect: never Yes/No
    (-0.012, 0.010, 0.02, BELOW),     # the README's fourth answer: CI [-0.022, -0.002]
    (0.015, 0.01, 0.02, BELOW),
    (0.25, 0.125, 0.25, BELOW),       # estimate exactly at +min_effect is not beyond it
    (-0.25, 0.125, 0.25, BELOW),
    (0.25 + 2 ** -10, 0.125, 0.25, Y),  # just beyond it
    # CI excludes 0, the estimate beyond ±min_effect: the direction
    (0.021, 0.015, 0.02, Y),
    (0.104, 0.05, 0.02, Y),
    (-0.03, 0.02, 0.02, N),
    (0.03, 0.025, 0.02, Y),           # CI [0.005, 0.055] straddles +min_effect: the estimate decides
    # a minimum effect of 0: every resolved difference has a direction
    (0.001, 0.0005, 0.0, Y),
    (0.0, 0.0, 0.0, INC),
    # no interval: one seed on a side, or an infinite half width
    (0.3, None, 0.02, INC),
    (0.0, None, 0.02, INC),
    (0.3, math.inf, 0.02, INC),
    (math.nan, 0.01, 0.02, INC),
])
def test_the_verdict_truth_table(estimate: float, hw: float | None, min_effect: float, expected: Verdict) -> None:
    assert classify(estimate, hw, min_effect) is expected
    # The rules are symmetric: flipping the sign flips Yes and No and keeps every other class.
    flipped = {Y: N, N: Y}.get(expected, expected)
    assert classify(-estimate, hw, min_effect) is flipped or math.isnan(estimate) or estimate == 0


def test_resolved_and_settled() -> None:
    assert [v for v in Verdict if resolved(v)] == [Y, N]
    assert {v for v in Verdict if settled(v)} == {Y, N, EQ}


@pytest.mark.parametrize(("answer", "expected"), [
    ("Yes: the larger lr (0.003) learned faster per training step — …", Y),
    ("No: the larger group_size (8) learned slower per episode consumed — …", N),
    ("No meaningful difference: the whole 95% CI of the difference lies within ±0.02 — …", EQ),
    ("A difference below the minimum of interest: the larger group_size (8) learned slower …", BELOW),
    ("Inconclusive: group_size=8 was ahead on average but …", INC),
    ("Best kl_coef=0.05 (resolved against the runner-up) — …", Y),
    ("Best kl_coef=0.05 scored highest — not resolved", None),
    ("Judged per training step, not per episode consumed as registered: within the 111 episodes every run "
     "reached, group_size=8 has only 2 held-out evaluation rounds (at least 4 needed); per training step every "
     "arm has at least 7. Yes: the larger group_size (8) learned faster per training step — …", Y),
    ("Judged per episode consumed, while the question says no axis (…). No meaningful difference: …", EQ),
    ("No answer: no run produced a usable reward curve (see LOG.md for the crashes).", None),
    ("Resolved: lr, temperature (their 95% CIs exclude 0 …)", None),
])
def test_an_answer_is_read_back_as_its_class(answer: str, expected: Verdict | None) -> None:
    assert answer_class(answer) is expected
