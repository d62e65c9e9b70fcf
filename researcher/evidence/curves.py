"""What a figure of learning curves plots: each arm's runs on one axis over the window the verdict judged.

A figure is evidence only if it shows what the verdict used. The analysis scores each run by the mean
height of its curve over ``[0, window]`` on the axis judged (``Evidence.budgets``: per step the steps
every run reached, per episode the episodes every run consumed). Arms matched on episodes train
different steps, so the per-step horizon is no window for the episode axis: cutting there drew a
4x-smaller group's curve at a quarter of the episodes it was judged on. Here each run is cut at its
axis' own window, interpolated at its edge as the analysis cuts it, so a curve's mean height is its
score and the arms' order on a panel is the Answer's.

Each arm also gets a mean curve and a 95% band (t interval over its seeds) on the grid of x values its
seeds share. ``rows`` writes what a figure plots as CSV rows (arm, axis, x, y, seed) beside it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from researcher.evidence import stats
from researcher.evidence.analysis import read_axes
from researcher.findings.records import Arm, Evidence

CSV_COLUMNS = ("arm", "axis", "x", "y", "seed")


@dataclass(frozen=True)
class SeedCurve:
    """One run's curve on one axis inside the window."""

    seed: int
    xs: list[float]
    ys: list[float]
    arm: str = ""  # set where seeds of several arms share a list (a figure before any analysis)


@dataclass(frozen=True)
class Band:
    """An arm's mean curve and its 95% interval on a shared grid (``low``/``high`` equal ``mean`` with one seed)."""

    xs: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]


@dataclass(frozen=True)
class ArmCurves:
    """An arm's runs on one axis over the window, its band, and its score there (the verdict's AUC)."""

    label: str
    axis: str
    window: float
    seeds: list[SeedCurve]
    band: Band
    score: float | None  # the mean AUC of the curves drawn: the verdict's score where the window is the verdict's


def clip(xs: Sequence[float], ys: Sequence[float], end: float) -> tuple[list[float], list[float]]:
    """The points of a curve inside ``[0, end]``, ending at ``end`` by linear interpolation where the curve
    goes past it (``stats.auc_until`` and ``analysis._cut`` cut it the same way)."""
    n = sum(1 for x in xs if x <= end + 1e-9)
    out_x, out_y = [float(x) for x in xs[:n]], [float(y) for y in ys[:n]]
    if 0 < n < len(xs) and out_x[-1] < end:
        w = (end - xs[n - 1]) / (xs[n] - xs[n - 1])
        out_x.append(float(end))
        out_y.append(ys[n - 1] + w * (ys[n] - ys[n - 1]))
    return out_x, out_y


def band(seeds: Sequence[SeedCurve]) -> Band:
    """Mean and 95% t interval over ``seeds`` at every x any of them has, from where all have begun (each
    seed interpolated linearly between its own points)."""
    curves = [s for s in seeds if s.xs]
    if not curves:
        return Band([], [], [], [])
    start = max(s.xs[0] for s in curves)
    end = min(s.xs[-1] for s in curves)
    grid = sorted({x for s in curves for x in s.xs if start - 1e-9 <= x <= end + 1e-9})
    values = np.array([np.interp(grid, s.xs, s.ys) for s in curves])
    mean, low, high = [], [], []
    for column in values.T:
        e = stats.mean_ci(column.tolist())
        hw = e.half_width if len(curves) > 1 else 0.0
        mean.append(e.mean)
        low.append(e.mean - hw)
        high.append(e.mean + hw)
    return Band(grid, mean, low, high)


def on_axis(study: Evidence, axis: str, arms: Iterable[Arm] | None = None) -> list[ArmCurves]:
    """The scored arms' runs (``arms``, default the study's; they must carry ``runs``) on ``axis`` over the
    study's window there, best first by the mean AUC of what is drawn: on the study's own arms that is
    the score the verdict ranks them by."""
    window = study.budgets[axis]
    chosen = [a for a in (study.arms if arms is None else arms) if a.scored and a.runs]
    out = []
    for arm in chosen:
        seeds = []
        for seed, run_dir in zip(arm.seeds or range(len(arm.runs)), arm.runs, strict=True):
            curve = read_axes(Path(run_dir), study.metric)
            xs, ys = clip(curve.axis(axis), curve.values, window)
            seeds.append(SeedCurve(seed, xs, ys))
        drawn = [stats.auc_until(s.xs, s.ys, window) for s in seeds if s.xs]
        out.append(ArmCurves(arm.label or arm.name, axis, window, seeds, band(seeds),
                             sum(drawn) / len(drawn) if drawn else None))
    return sorted(out, key=lambda c: -(c.score if c.score is not None else float("-inf")))


def rows(curves: Iterable[ArmCurves]) -> list[dict[str, object]]:
    """Every plotted point: one row per seed and x (the mean and band follow from them)."""
    return [{"arm": c.label, "axis": c.axis, "x": x, "y": y, "seed": s.seed}
            for c in curves for s in c.seeds for x, y in zip(s.xs, s.ys, strict=True)]


def to_csv(items: Iterable[Mapping[str, object]], columns: Sequence[str] = CSV_COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(items)
    return buffer.getvalue()
