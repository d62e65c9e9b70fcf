"""Statistics of reward curves, checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from researcher import stats


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
