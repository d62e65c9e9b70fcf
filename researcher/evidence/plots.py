"""The study's figures (PNG, matplotlib's Agg backend: no display needed), each with its data beside it.

A figure shows what the verdict used (``researcher.evidence.curves``): each arm's runs on the verdict's
axis over the judged window, with the arm's mean and 95% band, the window's edge marked, and the arms
in the legend best first, as the Answer ranks them. Figures:

- ``iteration-<i>.png``: this iteration's arms on the verdict axis;
- ``axes.png``: the whole study (seeds pooled over iterations), one panel per measured axis, the
  verdict's first, each over its own window;
- ``dose-response.png`` (sweeps): knob value against AUC mean ± 95% CI, one panel per axis;
- ``looks.png``: each registered look's standardised difference against its boundary.

Each writes ``<name>.csv`` beside it (columns ``curves.CSV_COLUMNS``: arm, axis, x, y, seed), so a reader
can check a picture against the numbers. Every figure is at most ``PAGE_PX`` pixels wide, panels
stacked in a column: MLflow shows the study's figures at their pixel size in the experiment's
description (its Markdown allows no image width), and a wider one is cut at the box's right edge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from researcher.evidence import curves, stats
from researcher.findings.axes import AXIS_TEXT, AXIS_UNIT
from researcher.findings.records import Arm, Comparison, Evidence, IterationSummary
from swarm.atomic import write_atomic

DPI = 100
PAGE_PX = 640  # fits MLflow's description box in a 1400 px window with its chat panel open
PANEL_IN = (PAGE_PX / DPI, 2.7)  # one panel's width and height, inches
X_LABEL = {"step": "training step", "episode": "episodes consumed", "second": "wall-clock seconds",
           "token": "generated tokens"}


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _column(plt: Any, n: int, height: float = PANEL_IN[1]) -> tuple[Any, list[Any]]:
    """A page-wide figure of ``n`` panels, one under the other."""
    fig, panels = plt.subplots(n, 1, figsize=(PANEL_IN[0], height * n + 0.4), dpi=DPI, squeeze=False)
    return fig, [row[0] for row in panels]


def save(plt: Any, fig: Any, path: Path, data: str) -> Path:
    """The PNG at ``path`` and its data at ``path`` with ``.csv``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    write_atomic(path.with_suffix(".csv"), data)
    return path


def _colors(arms: Iterable[Arm]) -> dict[str, str]:
    """One colour per arm, the same in every figure of the study."""
    return {a.label or a.name: f"C{i % 10}" for i, a in enumerate(arms)}


def _curve_panel(ax: Any, shown: Sequence[curves.ArmCurves], study: Evidence, colors: dict[str, str]) -> None:
    """Seeds thin, mean thick, 95% band shaded; the window's edge dashed; legend best first."""
    axis = shown[0].axis if shown else study.axis
    window = study.budgets.get(axis, 0.0)
    for arm in shown:
        color = colors.get(arm.label, "C9")
        for seed in arm.seeds:
            ax.plot(seed.xs, seed.ys, color=color, alpha=0.25, linewidth=0.8)
        score = f"AUC {arm.score:.3f}, " if arm.score is not None else ""
        ax.plot(arm.band.xs, arm.band.mean, color=color, linewidth=2.2,
                label=f"{arm.label}: {score}n={len(arm.seeds)}")
        if len(arm.seeds) > 1:
            ax.fill_between(arm.band.xs, arm.band.low, arm.band.high, color=color, alpha=0.15, linewidth=0)
    if window > 0:
        ax.axvline(window, color="grey", linestyle="--", linewidth=1)
        ax.set_xlim(0, window * 1.02)
    ax.set_xlabel(X_LABEL[axis])
    ax.set_ylabel(study.metric)
    verdict = " · verdict axis · judged window" if axis == study.axis else " · window"
    ax.set_title(f"{AXIS_TEXT[axis]}{verdict} 0–{window:g} {AXIS_UNIT[axis]} (dashed)", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, title="mean ± 95% band, best first", title_fontsize=7)


def verdict_curves(study: Evidence, path: Path, title: str, arms: Sequence[Arm] | None = None) -> Path:
    """The arms (default the study's; they must carry their runs) on the verdict axis over the judged window."""
    plt = pyplot()
    shown = curves.on_axis(study, study.axis, arms)
    fig, panels = _column(plt, 1, 4.0)
    _curve_panel(panels[0], shown, study, _colors(study.arms))
    panels[0].set_title(f"{title}\n{panels[0].get_title()}", fontsize=9)
    return save(plt, fig, path, curves.to_csv(curves.rows(shown)))


def reward_curves(summary: IterationSummary, path: Path, title: str) -> Path:
    """This iteration's arms (``summary.experiments``) on the verdict axis over the study's judged window."""
    assert summary.study is not None  # analysis.summarize always pools
    return verdict_curves(summary.study, path, title, summary.experiments)


def raw_curves(runs: Sequence[curves.SeedCurve], path: Path, metric: str, title: str) -> Path:
    """Runs before any analysis (no verdict, no window yet): each run's curve per training step, one colour
    per arm."""
    plt = pyplot()
    fig, panels = _column(plt, 1, 4.0)
    ax, colors = panels[0], dict[str, str]()
    for run in runs:
        first = run.arm not in colors
        color = colors.setdefault(run.arm, f"C{len(colors) % 10}")
        ax.plot(run.xs, run.ys, color=color, linewidth=1.2, alpha=0.8, label=run.arm if first else None)
    ax.set_xlabel(X_LABEL["step"])
    ax.set_ylabel(metric)
    ax.set_title(f"{title} (not analysed yet: no judged window)", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    data = [{"arm": r.arm, "axis": "step", "x": x, "y": y, "seed": r.seed} for r in runs for x, y in zip(r.xs, r.ys, strict=True)]
    return save(plt, fig, path, curves.to_csv(data))


def axes_curves(study: Evidence, path: Path, title: str) -> Path:
    """Every arm's seeds (pooled over iterations) on each measured axis, the verdict's first, each over
    its own window."""
    plt = pyplot()
    order = [study.axis, *(a for a in study.measured if a != study.axis)]
    fig, panels = _column(plt, len(order))
    colors, data = _colors(study.arms), []
    for ax, axis in zip(panels, order, strict=True):
        shown = curves.on_axis(study, axis)
        _curve_panel(ax, shown, study, colors)
        data += curves.rows(shown)
    fig.suptitle(title, fontsize=10)
    return save(plt, fig, path, curves.to_csv(data))


def dose_response(study: Evidence, path: Path, title: str) -> Path:
    """Knob value against the AUC mean ± 95% CI of each value, one panel per axis; the best value marked.
    Its CSV holds each seed's AUC (x the knob value)."""
    plt = pyplot()
    measured = study.measured
    rows = [r for r in study.arms if r.scored]
    numeric = all(isinstance(r.value, (int, float)) for r in rows)
    if numeric:
        rows.sort(key=lambda r: r.value)
    fig, panels = _column(plt, len(measured))
    data: list[dict[str, object]] = []
    for ax, axis in zip(panels, measured, strict=True):
        xs = [r.value if numeric else i for i, r in enumerate(rows)]
        means = [r.axes[axis].mean for r in rows]
        errs = [r.axes[axis].hw or 0.0 for r in rows]
        ax.errorbar(xs, means, yerr=errs, marker="o", capsize=4, linewidth=1.5)
        data += [{"arm": r.label or r.name, "axis": axis, "x": x, "y": score, "seed": seed}
                 for x, r in zip(xs, rows, strict=True) for seed, score in zip(r.seeds, r.scores[axis], strict=True)]
        best = [(x, m) for x, m, r in zip(xs, means, rows, strict=True) if r.name == study.best]
        if best and axis == study.axis:
            ax.plot(*best[0], marker="*", markersize=14, color="C3", label=f"best {study.knob}={study.best_value}")
            ax.legend(fontsize=7)
        if numeric and rows and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(xs, [str(r.value) for r in rows])
        ax.set_xlabel(study.knob)
        ax.set_ylabel(f"AUC of {study.metric}")
        ax.set_title(AXIS_TEXT[axis] + (" (verdict axis)" if axis == study.axis else ""), fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save(plt, fig, path, curves.to_csv(data))


LOOK_COLUMNS = (*curves.CSV_COLUMNS, "boundary", "fraction", "diff", "hw")


def look_z(c: Comparison) -> tuple[float, float | None]:
    """(z, boundary) of one look: the difference on the scale of the look's registered boundary, scaled so
    that |z| crosses the boundary exactly when the look's interval excludes 0 (``z = boundary * diff / hw``;
    the t interval's degrees of freedom are folded in). The pilot spends no alpha and has no boundary:
    its z is diff over the plain 95% interval's standard error."""
    if c.boundary_z is not None and math.isfinite(c.boundary_z) and c.hw:
        return c.boundary_z * c.diff / c.hw, c.boundary_z
    plain = c.hw95 if c.hw95 is not None else c.hw
    return (stats.t975(math.inf) * c.diff / plain if plain else 0.0), None


def looks(history: Sequence[IterationSummary], path: Path, title: str) -> Path | None:
    """Each registered look's z of best − runner-up against its boundary (±), in look order; None when the
    study registered no looks."""
    marked = [c for s in history if (c := s.comparison) is not None and c.look is not None]
    if not marked:
        return None
    points = [(int(c.look or 0), *look_z(c), c) for c in marked]
    plt = pyplot()
    fig, panels = _column(plt, 1)
    ax = panels[0]
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color="C0", label="z of best − runner-up")
    bounded = [(x, edge) for x, _, edge, _ in points if edge is not None]
    if bounded:
        for sign in (1, -1):
            ax.plot([x for x, _ in bounded], [sign * edge for _, edge in bounded], color="C3", linestyle="--",
                    marker="_", markersize=14, label="boundary (±)" if sign == 1 else None)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks([p[0] for p in points], [f"look {x}" + ("" if edge is not None else " (pilot)")
                                           for x, _, edge, _ in points])
    ax.set_ylabel("z (decides where |z| ≥ boundary)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    data = [{"arm": f"{c.better_label or c.better} − {c.worse_label or c.worse}", "axis": "look", "x": x,
             "y": round(z, 4), "seed": "", "boundary": edge, "fraction": c.fraction, "diff": c.diff, "hw": c.hw}
            for x, z, edge, c in points]
    return save(plt, fig, path, curves.to_csv(data, LOOK_COLUMNS))
