"""Group-sequential boundaries by Lan–DeMets alpha spending (two-sided, overall alpha 0.05).

A study is decided at several looks (the pilot seeds, then each added batch of seeds). Testing every
look at the plain 1.96 inflates the false-positive rate (about 0.14 over five looks); spending alpha
over the looks keeps the chance of ever rejecting a true null at most alpha. The critical values are
exact for the given information fractions: the recursive numerical integration of Armitage, McPherson
and Rowe (1969) on the score process, as in Lan & DeMets (1983) and Jennison & Turnbull (2000, ch. 19).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from scipy import optimize
from scipy.special import ndtr
from scipy.stats import norm
from scipy.stats import t as student_t

ALPHA = 0.05
Spending = Literal["obrien-fleming", "pocock"]

_KINDS: tuple[str, ...] = get_args(Spending)
# Simpson intervals per look: at least 400 and at most 8000, and spaced no wider than an eighth of the
# next increment's sd (the kernel integrated against); the values are then good to about 1e-7.
_INTERVALS = (400, 8000)
_TAIL = 8.0  # where no boundary cuts it, the grid stops at 8 sd (mass beyond it is about 1e-15)
_Z_MAX = 40.0  # brentq's upper bracket: norm.sf(40) underflows to 0
_NEGLIGIBLE = 1e-10  # a look whose share is below this fraction of alpha spends nothing (z = inf)


@dataclass(frozen=True)
class Boundary:
    look: int  # 1-based
    fraction: float  # information fraction at this look, in (0, 1]
    z: float  # two-sided critical value on the z scale (|Z_k| >= z rejects); inf when this look spends nothing
    nominal: float  # the two-sided nominal level of this look: 2 * (1 - Phi(z))
    spent: float  # cumulative alpha spent up to and including this look


def _check(kind: str, alpha: float) -> None:
    if kind not in _KINDS:
        raise ValueError(f"unknown spending kind {kind!r}; expected one of {', '.join(_KINDS)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def spent(kind: Spending, fraction: float, alpha: float = ALPHA) -> float:
    """Two-sided Lan–DeMets spending function alpha(t), each side spending alpha/2: O'Brien–Fleming-type
    2 * (2 - 2 Phi(z_{1-alpha/4} / sqrt(t))); Pocock-type alpha * ln(1 + (e - 1) t). t >= 1 spends
    alpha; t <= 0 spends nothing."""
    _check(kind, alpha)
    if fraction >= 1.0:
        return alpha
    if fraction <= 0.0:
        return 0.0
    if kind == "obrien-fleming":
        # Each side spends alpha/2 by the one-sided 2 - 2 Phi(z_{1-alpha/4} / sqrt(t)): the convention of
        # the published two-sided tables (4.877 ... 2.031 at five looks). Spending the two-sided alpha
        # by 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) would open at 4.383 and end at 2.064.
        return float(4.0 * norm.sf(norm.isf(alpha / 4.0) / math.sqrt(fraction)))
    return alpha * math.log(1.0 + (math.e - 1.0) * fraction)


def boundaries(
    fractions: Sequence[float], kind: Spending = "obrien-fleming", alpha: float = ALPHA
) -> tuple[Boundary, ...]:
    """Critical values for looks at the given increasing information fractions (each in (0, 1]; a
    fraction >= 1 is the last look and spends all that is left). Exact: the recursive numerical
    integration of Armitage, McPherson and Rowe on the score process S_k = Z_k sqrt(t_k) with
    independent N(0, t_k - t_{k-1}) increments; the continuation sub-density is carried on a grid
    between looks."""
    _check(kind, alpha)
    ts = [float(f) for f in fractions]
    if not ts:
        raise ValueError("boundaries needs at least one information fraction")
    for i, t in enumerate(ts):
        if not math.isfinite(t) or t <= 0.0:
            raise ValueError(f"information fractions must be finite and > 0, got {t!r} at look {i + 1}")
        if i and t <= ts[i - 1]:
            raise ValueError(f"information fractions must increase, got {ts[i - 1]!r} then {t!r}")
        if t >= 1.0 and i != len(ts) - 1:
            raise ValueError(f"a fraction >= 1 must be the last look, got {t!r} at look {i + 1} of {len(ts)}")
    # Rounded so that float noise in the callers' fractions (n / n_max) still hits the cache.
    return _boundaries(tuple(round(min(t, 1.0), 12) for t in ts), kind, round(alpha, 15))


@functools.lru_cache(maxsize=256)
def _boundaries(ts: tuple[float, ...], kind: Spending, alpha: float) -> tuple[Boundary, ...]:
    # The sub-density of S on the continuation region, as points and Simpson masses; S_0 = 0 surely.
    points = np.zeros(1)
    masses = np.ones(1)
    previous_t = 0.0
    spent_so_far = 0.0
    looks: list[Boundary] = []
    for k, t in enumerate(ts, start=1):
        sd = math.sqrt(t - previous_t)
        root_t = math.sqrt(t)
        # Measured against what the earlier looks actually spent, so a look that spends nothing hands
        # its share on and the last look brings the total to alpha.
        share = spent(kind, t, alpha) - spent_so_far
        if share < _NEGLIGIBLE * alpha:
            z = math.inf
        else:
            args = (points, masses, root_t, sd, share)
            z = optimize.brentq(_excess, 0.0, _Z_MAX, args=args, xtol=1e-12, rtol=1e-12)
            spent_so_far += share
        looks.append(Boundary(k, t, z, float(2.0 * norm.sf(z)), spent_so_far))
        if k < len(ts):
            half = min(z, _TAIL) * root_t
            grid, weights = _simpson(half, math.sqrt(ts[k] - t) / 8.0)
            gaps = (grid[:, None] - points[None, :]) / sd
            density = np.exp(-0.5 * gaps * gaps) @ masses / (sd * math.sqrt(2.0 * math.pi))
            points, masses = grid, density * weights
        previous_t = t
    return tuple(looks)


def _excess(z: float, points: np.ndarray, masses: np.ndarray, root_t: float, sd: float, share: float) -> float:
    """P(first crossing at this look | boundary z) minus the share it may spend: the continuing mass
    times the chance its N(0, sd^2) increment leaves (-z sqrt(t), z sqrt(t))."""
    b = z * root_t
    # ndtr(-x) is norm.sf(x) without the per-call overhead that brentq would multiply.
    return float(masses @ (ndtr((points - b) / sd) + ndtr((-b - points) / sd))) - share


def _simpson(half: float, step: float) -> tuple[np.ndarray, np.ndarray]:
    """Points on [-half, half] and their composite Simpson weights, spaced at most ``step`` apart."""
    low, high = _INTERVALS
    intervals = min(high, max(low, 2 * math.ceil(half / step)))
    grid = np.linspace(-half, half, intervals + 1)
    weights = np.ones(intervals + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return grid, weights * (grid[1] - grid[0]) / 3.0


@functools.lru_cache(maxsize=1024)
def critical_t(boundary: Boundary, df: float) -> float:
    """The look's critical value for a Student t statistic with ``df`` degrees of freedom at the same
    nominal level (scipy.stats.t.isf(nominal/2, df)); inf when nominal is 0 or df < 1."""
    if boundary.nominal <= 0.0 or not df >= 1.0:
        return math.inf
    if math.isinf(df):
        return boundary.z
    return float(student_t.isf(boundary.nominal / 2.0, df))
