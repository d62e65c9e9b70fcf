"""Reward-curve plots (PNG, matplotlib's Agg backend: no display needed).

One figure per iteration: each configuration's mean curve over its seeds (thick) and the
individual seeds (thin), against the training step. For the whole study: the same curves on the
three axes (per training step, per episode consumed, per wall-clock second), and for a sweep the
dose-response curve (knob value against AUC mean ± 95% CI, one panel per axis).

Every figure is at most ``PAGE_PX`` pixels wide, panels stacked in a column: MLflow shows the study's
figures at their pixel size in the experiment's description (its Markdown allows no image width), and
a wider one is cut at the box's right edge.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from researcher.evidence import analysis
from researcher.findings.records import Evidence, IterationSummary

DPI = 100
PAGE_PX = 640  # fits MLflow's description box in a 1400 px window with its chat panel open
PANEL_IN = (PAGE_PX / DPI, 2.7)  # one panel's width and height, inches


def reward_curves(summary: IterationSummary, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, horizon = summary.metric, summary.horizon
    fig, ax = plt.subplots(figsize=(PANEL_IN[0], 4.0), dpi=DPI)
    for index, row in enumerate(summary.experiments):
        color = f"C{index % 10}"
        curves = [(c.steps, c.values) for c in (analysis.read_axes(Path(d), metric, horizon) for d in row.runs)]
        for steps, values in curves:
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
        common = sorted(set.intersection(*(set(s) for s, _ in curves))) if curves else []
        if common:
            lookup = [dict(zip(s, v, strict=True)) for s, v in curves]
            mean = [sum(c[s] for c in lookup) / len(lookup) for s in common]
            label = f"{summary.knob}={row.value} (n={len(curves)})"
            ax.plot(common, mean, color=color, linewidth=2.2, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _column(plt: Any, n: int) -> tuple[Any, list[Any]]:
    """A page-wide figure of ``n`` panels, one under the other."""
    fig, panels = plt.subplots(n, 1, figsize=(PANEL_IN[0], PANEL_IN[1] * n + 0.4), dpi=DPI, squeeze=False)
    return fig, [row[0] for row in panels]


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    fig.clf()
    return path


def axes_curves(study: Evidence, path: Path, title: str) -> Path:
    """Each configuration's seeds (pooled over iterations) against steps, episodes consumed and seconds."""
    plt = _pyplot()
    measured = study.measured
    fig, panels = _column(plt, len(measured))
    for ax, axis in zip(panels, measured, strict=True):
        for index, row in enumerate(study.arms):
            color = f"C{index % 10}"
            for n, run_dir in enumerate(row.runs):
                curve = analysis.read_axes(Path(run_dir), study.metric, study.horizon)
                ax.plot(curve.axis(axis), curve.values, color=color, alpha=0.6, linewidth=1.0,
                        label=f"{study.knob}={row.value} (n={len(row.runs)})" if n == 0 else None)
        if axis != "step":
            ax.axvline(study.budgets[axis], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel({"step": "training step", "episode": "episodes consumed", "second": "wall-clock seconds",
                       "token": "generated tokens"}[axis])
        ax.set_ylabel(study.metric)
        ax.set_title(analysis.AXIS_TEXT[axis] + (" (verdict axis)" if axis == study.axis else ""), fontsize=9)
        ax.grid(alpha=0.3)
    if panels[0].get_legend_handles_labels()[0]:
        panels[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    out = _save(fig, path)
    plt.close(fig)
    return out


def dose_response(study: Evidence, path: Path, title: str) -> Path:
    """Knob value against the AUC mean ± 95% CI of each value, one panel per axis; the best value marked."""
    plt = _pyplot()
    measured = study.measured
    rows = [r for r in study.arms if r.scored]
    numeric = all(isinstance(r.value, (int, float)) for r in rows)
    if numeric:
        rows.sort(key=lambda r: r.value)
    fig, panels = _column(plt, len(measured))
    for ax, axis in zip(panels, measured, strict=True):
        xs = [r.value if numeric else i for i, r in enumerate(rows)]
        means = [r.axes[axis].mean for r in rows]
        errs = [r.axes[axis].hw or 0.0 for r in rows]
        ax.errorbar(xs, means, yerr=errs, marker="o", capsize=4, linewidth=1.5)
        best = [(x, m) for x, m, r in zip(xs, means, rows, strict=True) if r.name == study.best]
        if best and axis == study.axis:
            ax.plot(*best[0], marker="*", markersize=14, color="C3", label=f"best {study.knob}={study.best_value}")
            ax.legend(fontsize=7)
        positive = numeric and rows and min(xs) > 0 and max(xs) / min(xs) >= 10
        if positive:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(xs, [str(r.value) for r in rows])
        ax.set_xlabel(study.knob)
        ax.set_ylabel(f"AUC of {study.metric}")
        ax.set_title(analysis.AXIS_TEXT[axis] + (" (verdict axis)" if axis == study.axis else ""), fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    out = _save(fig, path)
    plt.close(fig)
    return out
