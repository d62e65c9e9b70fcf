"""Reward-curve plots (PNG, matplotlib's Agg backend: no display needed).

One figure per iteration: each configuration's mean curve over its seeds (thick) and the
individual seeds (thin), against the training step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from researcher import runs


def reward_curves(summary: dict[str, Any], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, horizon = summary["metric"], summary["horizon"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for index, row in enumerate(summary["experiments"]):
        color = f"C{index % 10}"
        curves = [runs.read_curve(Path(d), metric, horizon) for d in row["runs"]]
        for steps, values in curves:
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
        common = sorted(set.intersection(*(set(s) for s, _ in curves))) if curves else []
        if common:
            lookup = [dict(zip(s, v, strict=True)) for s, v in curves]
            mean = [sum(c[s] for c in lookup) / len(lookup) for s in common]
            label = f"{summary['knob']}={row['value']} (n={len(curves)})"
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
