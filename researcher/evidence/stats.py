"""Statistics of reward curves: area under the curve, final level, mean ± 95% CI over seeds.

Curves are compared on any increasing axis (training steps, episodes consumed, wall seconds) by their
mean height up to a budget every run reached. Also the noise floor (pooled within-configuration sd)
and the seeds a comparison needs. The t quantiles are tabulated to keep scipy out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95% Student t quantiles, t_{0.975, df}, df = 1..30; beyond that the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: float) -> float:
    if df < 1:
        return math.inf
    if df >= len(_T975):
        return 1.96 if df > len(_T975) + 10 else _T975[-1]
    # Welch's df is fractional: interpolate linearly between the tabulated integers.
    low = math.floor(df)
    frac = df - low
    return _T975[low - 1] if frac == 0 else _T975[low - 1] * (1 - frac) + _T975[low] * frac


@dataclass(frozen=True)
class Estimate:
    mean: float
    half_width: float  # 95% CI half width; inf with a single sample
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def text(self, digits: int = 3) -> str:
        if self.n < 2:
            return f"{self.mean:.{digits}f} (n=1, no CI)"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} (n={self.n})"


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and 95% t-interval half width of independent samples (one per seed)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, math.inf, 1)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Estimate(mean, t975(n - 1) * math.sqrt(var / n), n)


def diff_ci(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Welch 95% interval for mean(a) - mean(b); a CI excluding 0 is a clear difference."""
    ea, eb = mean_ci(a), mean_ci(b)
    if ea.n < 2 or eb.n < 2:
        return Estimate(ea.mean - eb.mean, math.inf, min(ea.n, eb.n))
    va = sum((v - ea.mean) ** 2 for v in a) / (ea.n - 1) / ea.n
    vb = sum((v - eb.mean) ** 2 for v in b) / (eb.n - 1) / eb.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(ea.mean - eb.mean, 0.0, min(ea.n, eb.n))
    df = (va + vb) ** 2 / ((va ** 2) / (ea.n - 1) + (vb ** 2) / (eb.n - 1))
    return Estimate(ea.mean - eb.mean, t975(df) * se, min(ea.n, eb.n))


def auc(steps: Sequence[int], values: Sequence[float], horizon: int | None = None) -> float:
    """Normalised area under a curve over its steps (trapezoid / step span) = its mean height.

    Only steps ``<= horizon`` count, so runs that trained past the target compare fairly.
    A single point's area is its value.
    """
    points = sorted((s, v) for s, v in zip(steps, values, strict=True) if horizon is None or s <= horizon)
    if not points:
        raise ValueError("auc needs at least one point")
    if len(points) == 1:
        return points[0][1]
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in itertools.pairwise(points))
    return area / (points[-1][0] - points[0][0])


def final_level(values: Sequence[float], window: int = 5) -> float:
    """Mean of the last ``window`` values: the level a run reached, less noisy than the last point."""
    if not values:
        raise ValueError("final_level needs at least one value")
    tail = list(values)[-window:]
    return sum(tail) / len(tail)


def auc_until(xs: Sequence[float], values: Sequence[float], horizon: float) -> float:
    """Mean height of a curve from its first point to ``horizon`` on any increasing axis (episodes
    consumed, seconds): the curve is cut at ``horizon`` by linear interpolation, so runs that reach a
    shared budget at different steps compare over exactly that budget. A curve that ends before
    ``horizon`` counts over the span it has."""
    points = sorted(zip(xs, values, strict=True))
    if not points:
        raise ValueError("auc_until needs at least one point")
    kept = [(x, v) for x, v in points if x <= horizon]
    after = next(((x, v) for x, v in points if x > horizon), None)
    if kept and after is not None and kept[-1][0] < horizon:
        (x0, v0), (x1, v1) = kept[-1], after
        kept.append((horizon, v0 + (v1 - v0) * (horizon - x0) / (x1 - x0)))
    if not kept:
        return points[0][1]
    if len(kept) == 1 or kept[-1][0] == kept[0][0]:
        return kept[-1][1]
    area = sum((x1 - x0) * (v0 + v1) / 2 for (x0, v0), (x1, v1) in itertools.pairwise(kept))
    return area / (kept[-1][0] - kept[0][0])


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """Pooled within-group standard deviation and the number of samples it rests on.

    Each group holds one configuration's per-seed scores, so the result is the spread of identical
    configurations (the noise floor). Groups with fewer than 2 samples add nothing; None when no
    group has 2.
    """
    used = [list(g) for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in used)
    if df == 0:
        return None, 0
    ss = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in used)
    return math.sqrt(ss / df), sum(len(g) for g in used)


_Z_POWER = 0.84  # one-sided z quantile of 80% power
_MAX_SEEDS = 10_000


def seeds_needed(diff: float, sd: float | None, min_effect: float) -> int | None:
    """Seeds per arm for a comparison to resolve, for two equal arms with common standard deviation
    ``sd`` (the noise floor): the smallest n >= 2 with, using t_{0.975, 2n-2} and se = sd * sqrt(2/n),

    - when |diff| >= min_effect: (t + z_0.8) se <= |diff|, i.e. 80% power to exclude 0 if the true
      difference is the observed one;
    - otherwise: t se <= min_effect - |diff|, a CI narrow enough to fit inside ±min_effect around the
      observed difference (a "no meaningful difference" verdict).

    None when sd is unknown or more than 10,000 seeds would be needed.
    """
    if sd is None or not math.isfinite(sd):
        return None
    detect = abs(diff) >= min_effect and diff != 0
    target = abs(diff) if detect else min_effect - abs(diff)
    for n in range(2, _MAX_SEEDS + 1):
        se = sd * math.sqrt(2 / n)
        if (t975(2 * n - 2) + (_Z_POWER if detect else 0.0)) * se <= target:
            return n
    return None
