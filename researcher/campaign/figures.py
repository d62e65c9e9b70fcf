"""A goal campaign's figures, each with its data beside it (``<name>.csv``), in the campaign's figures/.

- ``progress.png``: the incumbent's objective (its arm's mean AUC in each comparison that measured it)
  against the CPU-hours spent so far, with each round's tested changes marked (filled: held);
- ``forest.png``: every confirmation's effect with its interval at the level it was tested, by round and
  outcome; the headline's verification last.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from researcher.campaign.discovery import Test
from researcher.campaign.record import CampaignRecord
from researcher.evidence import curves
from researcher.evidence.plots import PAGE_PX, pyplot, save


@dataclass(frozen=True)
class Point:
    """One confirmation: CPU-hours spent when it ended, and the incumbent's objective after it."""

    round: int
    kind: str
    changes: str
    cpu_hours: float
    objective: float | None  # the incumbent after it: a combination that held, verify's incumbent, else the control
    tested: float | None     # the changed arm's objective
    diff: float
    low: float
    high: float
    alpha: float
    held: bool


def _points(rec: CampaignRecord) -> list[Point]:
    d = rec.discovery
    if d is None:
        return []
    spent, out = 0.0, []
    tests = iter(d.tests)
    for claim in rec.claims:
        spent += claim.cpu_hours
        if claim.stage is None or claim.stage.alpha is None or not claim.recorded:
            continue
        t: Test | None = next(tests, None)
        if t is None:
            break
        kept = t.treatment if (t.held and t.kind == "combine") or t.kind == "verify" else t.control
        out.append(Point(t.round, t.kind, ", ".join(f"{c.knob}={c.value}" for c in t.changes), round(spent, 4), kept,
                         t.treatment, t.diff, t.low, t.high, t.alpha, t.held))
    return out


def write(rec: CampaignRecord, folder: Path) -> list[Path]:
    """progress.png and forest.png (with their CSVs) under ``folder``; nothing before the first confirmation."""
    rows = _points(rec)
    if not rows:
        return []
    plt = pyplot()
    data = curves.to_csv([asdict(r) for r in rows], [f.name for f in fields(Point)])
    written = []
    fig, ax = plt.subplots(figsize=(PAGE_PX / 100, 3.2), dpi=100)
    measured = [r for r in rows if r.objective is not None]
    ax.step([r.cpu_hours for r in measured], [r.objective for r in measured], where="post", color="C0",
            label="incumbent's objective")
    for r in rows:
        if r.tested is not None:
            ax.scatter(r.cpu_hours, r.tested, color="C2" if r.held else "white", edgecolors="C2", zorder=3)
            ax.annotate(f"r{r.round} {r.kind}", (r.cpu_hours, r.tested), fontsize=6, textcoords="offset points",
                        xytext=(3, 3))
    ax.set_xlabel("CPU-hours spent")
    ax.set_ylabel("objective (AUC)")
    ax.set_title(f"{rec.name}: the incumbent, and each tested change (filled: held)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    written.append(save(plt, fig, folder / "progress.png", data))
    fig, ax = plt.subplots(figsize=(PAGE_PX / 100, 1.2 + 0.3 * len(rows)), dpi=100)
    for y, r in enumerate(reversed(rows)):
        low, high = (v if math.isfinite(v) else r.diff for v in (r.low, r.high))  # no interval: the point alone
        color = "C2" if r.held else "C7"
        ax.plot([low, high], [y, y], color=color, linewidth=2)
        ax.plot(r.diff, y, marker="o", color=color)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"r{r.round} {r.kind}: {r.changes}"[:60] for r in reversed(rows)], fontsize=6)
    ax.set_xlabel("treatment − control (AUC), interval at the test's level", fontsize=8)
    ax.set_title("every confirmation (green: held)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    written.append(save(plt, fig, folder / "forest.png", data))
    return written
