"""Group-sequential boundaries: published Lan–DeMets values and a Monte Carlo check of the overall alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from researcher.evidence import sequential
from researcher.evidence.sequential import Spending

FIVE = (0.2, 0.4, 0.6, 0.8, 1.0)
UNEQUAL = (0.2, 0.45, 0.7, 1.0)


def _ever_crosses(fractions: tuple[float, ...], z: list[float], paths: int = 200_000) -> float:
    """Fraction of null Brownian paths with |Z_k| >= z_k at some look."""
    t = np.asarray(fractions)
    rng = np.random.default_rng(20240611)
    steps = rng.standard_normal((paths, len(t))) * np.sqrt(np.diff(t, prepend=0.0))
    zk = np.cumsum(steps, axis=1) / np.sqrt(t)
    return float(np.mean(np.any(np.abs(zk) >= np.asarray(z), axis=1)))


def test_obrien_fleming_matches_published_five_looks() -> None:
    # Lan–DeMets O'Brien–Fleming-type spending, five equal looks, two-sided alpha 0.05.
    zs = [b.z for b in sequential.boundaries(FIVE)]
    assert zs == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=0.001)


def test_pocock_five_looks_is_nearly_flat() -> None:
    zs = [b.z for b in sequential.boundaries(FIVE, "pocock")]
    assert zs == pytest.approx([2.438, 2.427, 2.410, 2.397, 2.386], abs=0.001)


@pytest.mark.parametrize("kind", ["obrien-fleming", "pocock"])
def test_one_look_is_the_fixed_sample_test(kind: Spending) -> None:
    (only,) = sequential.boundaries([1.0], kind)
    assert only.z == pytest.approx(1.95996, abs=1e-4)
    assert only.nominal == pytest.approx(0.05) and only.spent == pytest.approx(0.05)
    assert only.look == 1 and only.fraction == 1.0


@pytest.mark.parametrize("kind", ["obrien-fleming", "pocock"])
def test_spending_is_cumulative_and_ends_at_alpha(kind: Spending) -> None:
    looks = sequential.boundaries(UNEQUAL, kind)
    assert [b.look for b in looks] == [1, 2, 3, 4]
    assert [b.spent for b in looks] == pytest.approx([sequential.spent(kind, t) for t in UNEQUAL])
    assert looks[-1].spent == pytest.approx(sequential.ALPHA)
    for b in looks:
        assert b.nominal == pytest.approx(2 * norm.sf(b.z))
        assert b.nominal <= b.spent
    assert sequential.spent(kind, 1.5) == sequential.ALPHA
    assert sequential.spent(kind, 0.0) == 0.0


@pytest.mark.parametrize("fractions", [FIVE, UNEQUAL])
@pytest.mark.parametrize("kind", ["obrien-fleming", "pocock"])
def test_monte_carlo_overall_alpha(kind: Spending, fractions: tuple[float, ...]) -> None:
    z = [b.z for b in sequential.boundaries(fractions, kind)]
    assert _ever_crosses(fractions, z) == pytest.approx(0.05, abs=0.004)


def test_plain_196_at_every_look_inflates_alpha() -> None:
    assert _ever_crosses(FIVE, [1.959964] * 5) > 0.1
    assert _ever_crosses(UNEQUAL, [1.959964] * 4) > 0.08


def test_an_early_look_that_spends_nothing_is_infinite() -> None:
    first, second, last = sequential.boundaries([0.01, 0.5, 1.0])
    assert math.isinf(first.z) and first.nominal == 0.0 and first.spent == 0.0
    assert math.isinf(sequential.critical_t(first, 30))
    assert second.z < 4 and last.spent == pytest.approx(0.05)


def test_fraction_past_one_is_the_last_look() -> None:
    assert sequential.boundaries([0.5, 1.3]) == sequential.boundaries([0.5, 1.0])


def test_critical_t_converges_to_z() -> None:
    look = sequential.boundaries(FIVE)[2]
    assert sequential.critical_t(look, 1e7) == pytest.approx(look.z, abs=1e-4)
    assert sequential.critical_t(look, math.inf) == look.z
    assert sequential.critical_t(look, 3) > sequential.critical_t(look, 30) > look.z
    assert math.isinf(sequential.critical_t(look, 0.5))


@pytest.mark.parametrize(
    ("fractions", "message"),
    [
        ([], "at least one"),
        ([0.5, 0.5], "increase"),
        ([0.6, 0.4], "increase"),
        ([0.0, 1.0], "> 0"),
        ([-0.2, 1.0], "> 0"),
        ([math.nan], "> 0"),
        ([1.0, 1.2], "last look"),
    ],
)
def test_bad_fractions_raise(fractions: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sequential.boundaries(fractions)


def test_unknown_kind_raises() -> None:
    with pytest.raises(ValueError, match="unknown spending kind"):
        sequential.boundaries(FIVE, "haybittle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown spending kind"):
        sequential.spent("linear", 0.5)  # type: ignore[arg-type]
