"""Statistics of reward curves, checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from researcher.evidence import stats


def test_mean_ci_uses_student_t() -> None:
    est = stats.mean_ci([1.0, 2.0, 3.0])
    # sd = 1, se = 1/sqrt(3), t(0.975, 2) = 4.303
    assert est.mean == pytest.approx(2.0)
    assert est.half_width == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert est.low < 2.0 < est.high


def test_mean_ci_single_value_has_no_interval() -> None:
    est = stats.mean_ci([0.5])
    assert est.n == 1 and math.isinf(est.half_width)
    with pytest.raises(ValueError):
        stats.mean_ci([])


def test_auc_is_mean_height_and_respects_horizon() -> None:
    # A ramp 0 -> 1 over steps 1..3 has mean height 0.5 by trapezoids.
    assert stats.auc([1, 2, 3], [0.0, 0.5, 1.0]) == pytest.approx(0.5)
    # Steps past the horizon are ignored.
    assert stats.auc([1, 2, 3, 4], [0.0, 0.5, 1.0, 100.0], horizon=3) == pytest.approx(0.5)
    assert stats.auc([5], [0.3]) == pytest.approx(0.3)


def test_diff_ci_detects_a_clear_difference() -> None:
    clear = stats.diff_ci([0.60, 0.62, 0.61], [0.20, 0.22, 0.21])
    assert clear.low > 0
    unclear = stats.diff_ci([0.5, 0.1], [0.3, 0.35])
    assert unclear.low < 0 < unclear.high


def test_final_level_averages_the_tail() -> None:
    assert stats.final_level([0, 0, 0, 1, 1, 1, 1, 1], window=5) == pytest.approx(1.0)


def test_auc_until_cuts_the_curve_at_a_shared_budget() -> None:
    # Episodes 0, 10, 20 with rewards 0, 1, 1: over a 5-episode budget the curve is cut at 0.5.
    assert stats.auc_until([0, 10, 20], [0.0, 1.0, 1.0], 5) == pytest.approx(0.25)
    assert stats.auc_until([0, 10, 20], [0.0, 1.0, 1.0], 20) == pytest.approx(0.75)
    assert stats.auc_until([0, 10], [0.0, 1.0], 30) == pytest.approx(0.5)  # ends early: over the span it has


def test_pooled_sd_is_the_spread_of_identical_configurations() -> None:
    # Within-group deviations: (-1, 1) and (-2, 0, 2): ss = 2 + 8 = 10 over df = 1 + 2.
    sd, seeds = stats.pooled_sd([[1.0, 3.0], [2.0, 4.0, 6.0], [9.0]])
    assert sd == pytest.approx(math.sqrt(10 / 3)) and seeds == 5
    assert stats.pooled_sd([[1.0], [2.0]]) == (None, 0)


def test_seeds_needed_with_student_t() -> None:
    # Difference 0.1 at sd 0.1 (>= min_effect): (t_{0.975, 2n-2} + 0.84) sqrt(2/n) <= 1 first holds at n = 17
    # (t = 2.042: 2.882 * 0.343 = 0.989; at n = 16, 2.882 * 0.354 = 1.019).
    assert stats.seeds_needed(0.1, 0.1, 0.02) == 17
    # Difference 0.01 inside min_effect 0.02: t_{0.975, 2n-2} * 0.05 * sqrt(2/n) <= 0.01; t = 1.9662 at n = 194
    # (1.9662^2 * 50 = 193.3); at n = 193, 1.9662^2 * 50 > 193.
    assert stats.seeds_needed(0.01, 0.05, 0.02) == 194
    assert stats.seeds_needed(0.5, 0.01, 0.02) == 2
    assert stats.seeds_needed(0.1, None, 0.02) is None and stats.seeds_needed(0.0, 1.0, 0.02) is None


def test_t_quantiles_come_from_scipy() -> None:
    assert stats.t975(2) == pytest.approx(4.302653, rel=1e-6)
    assert stats.t975(7.5) == pytest.approx(2.3342, rel=1e-3)  # Welch's fractional df
    assert math.isinf(stats.t975(0.5))


def test_paired_interval_cancels_what_a_seed_does_to_both_arms() -> None:
    # Seeds move both arms together by a lot; the arms differ by 0.10 +- 0.01 within each seed.
    a = {1: 0.30, 2: 0.61, 3: 0.90, 4: 0.45}
    b = {1: 0.19, 2: 0.52, 3: 0.79, 4: 0.36}
    paired = stats.compare_arms(a, b)
    welch = stats.diff_ci(list(a.values()), list(b.values()))
    assert paired.paired and not welch.paired
    assert paired.mean == pytest.approx(0.10)
    sd = math.sqrt(4 * 0.01 ** 2 / 3)  # the differences 0.11, 0.09, 0.11, 0.09 around their mean 0.10
    assert paired.half_width == pytest.approx(stats.t975(3) * sd / 2, rel=1e-6)
    assert paired.low > 0 and welch.low < 0  # the seed's spread hides the difference from Welch's interval


def test_unshared_seeds_fall_back_to_welch() -> None:
    a, b = {1: 0.5, 2: 0.6, 3: 0.55}, {11: 0.4, 12: 0.45, 3: 0.5}
    e = stats.compare_arms(a, b)  # one shared seed: no paired interval
    assert not e.paired and e == stats.diff_ci([0.5, 0.6, 0.55], [0.4, 0.45, 0.5])
    with pytest.raises(ValueError):
        stats.paired_ci({1: 0.1}, {2: 0.2})


def test_seeds_needed_paired_and_at_a_stricter_level() -> None:
    # Paired: se = sd / sqrt(n) on n - 1 df. A difference of 0.1 with sd 0.1: (t_{n-1} + 0.84) / sqrt(n) <= 1.
    assert stats.seeds_needed(0.1, 0.1, 0.02, paired=True) == 10
    assert stats.seeds_needed(0.1, 0.1, 0.02, paired=True, nominal=0.01) > 10
