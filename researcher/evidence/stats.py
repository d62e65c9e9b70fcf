"""Statistics of reward curves: area under the curve, final level, mean ± 95% CI over seeds.

Curves are compared on any increasing axis (training steps, episodes consumed, wall seconds) by their
mean height up to a budget every run reached. Two arms that ran the same seeds compare by the paired
t interval of their per-seed differences (the seed's task order and held-out set cancel out); arms
without shared seeds by Welch's interval. Also the noise floor (pooled within-configuration sd) and the
seeds a comparison needs. Quantiles come from ``scipy.stats``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as _scipy


@functools.lru_cache(maxsize=4096)
def t_quantile(df: float, level: float = 0.975) -> float:
    """Student t quantile t_{level, df}; inf below one degree of freedom (no interval)."""
    if df < 1 or not math.isfinite(df):
        return math.inf if df < 1 else float(_scipy.norm.ppf(level))
    return float(_scipy.t.ppf(level, df))


def t975(df: float) -> float:
    """The two-sided 95% Student t quantile t_{0.975, df} (Welch's fractional df included)."""
    return t_quantile(df)


@dataclass(frozen=True)
class Estimate:
    mean: float
    half_width: float  # 95% CI half width; inf with a single sample
    n: int
    se: float = math.inf  # standard error of ``mean``: a boundary other than 95% scales this
    df: float = 0.0  # degrees of freedom of the t interval
    paired: bool = False  # a difference read from per-seed pairs

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
    se = math.sqrt(var / n)
    return Estimate(mean, t975(n - 1) * se, n, se, n - 1)


def diff_ci(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Welch 95% interval for mean(a) - mean(b); a CI excluding 0 is a clear difference."""
    ea, eb = mean_ci(a), mean_ci(b)
    if ea.n < 2 or eb.n < 2:
        return Estimate(ea.mean - eb.mean, math.inf, min(ea.n, eb.n))
    va = sum((v - ea.mean) ** 2 for v in a) / (ea.n - 1) / ea.n
    vb = sum((v - eb.mean) ** 2 for v in b) / (eb.n - 1) / eb.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(ea.mean - eb.mean, 0.0, min(ea.n, eb.n), 0.0, ea.n + eb.n - 2)
    df = (va + vb) ** 2 / ((va ** 2) / (ea.n - 1) + (vb ** 2) / (eb.n - 1))
    return Estimate(ea.mean - eb.mean, t975(df) * se, min(ea.n, eb.n), se, df)


def paired_ci(a: Mapping[int, float], b: Mapping[int, float]) -> Estimate:
    """Paired 95% t interval for mean(a - b) over the seeds both hold (``{seed: score}``): each seed's
    difference is one sample, so what a seed does to both arms alike (its task order) cancels."""
    shared = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in shared]
    if not diffs:
        raise ValueError("paired_ci needs at least one seed both arms ran")
    e = mean_ci(diffs)
    return Estimate(e.mean, e.half_width, e.n, e.se, e.df, paired=True)


def compare_arms(a: Mapping[int, float], b: Mapping[int, float]) -> Estimate:
    """mean(a) - mean(b) by the paired interval where at least 2 seeds are shared (runs without a partner
    are left out), else by Welch's interval over all runs."""
    if len(set(a) & set(b)) >= 2:
        return paired_ci(a, b)
    return diff_ci(list(a.values()), list(b.values()))


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


def seeds_needed(diff: float, sd: float | None, min_effect: float, *, paired: bool = False,
                 nominal: float = 0.05) -> int | None:
    """Seeds per arm for a comparison to resolve: the smallest n >= 2 with, at the two-sided ``nominal``
    level (0.05; a sequential design's last look has a smaller one) and its t quantile ``t``,

    - when |diff| >= min_effect: (t + z_0.8) se <= |diff|, i.e. 80% power to exclude 0 if the true
      difference is the observed one;
    - otherwise: t se <= min_effect - |diff|, a CI narrow enough to fit inside ±min_effect around the
      observed difference (a "no meaningful difference" verdict).

    Unpaired, ``sd`` is the noise floor of one arm: se = sd sqrt(2/n) on 2n - 2 df; ``paired``, ``sd`` is
    the spread of the per-seed differences: se = sd / sqrt(n) on n - 1 df. None when sd is unknown or
    more than 10,000 seeds would be needed.
    """
    if sd is None or not math.isfinite(sd):
        return None
    detect = abs(diff) >= min_effect and diff != 0
    target = abs(diff) if detect else min_effect - abs(diff)

    def enough(n: int) -> bool:  # monotone in n: se and the t quantile both shrink
        se, df = (sd / math.sqrt(n), n - 1) if paired else (sd * math.sqrt(2 / n), 2 * n - 2)
        return (t_quantile(df, 1 - nominal / 2) + (_Z_POWER if detect else 0.0)) * se <= target

    if target <= 0 or not enough(_MAX_SEEDS):
        return None
    low, high = 1, _MAX_SEEDS  # enough(high) holds, enough(low) is not known to
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return max(high, 2)
