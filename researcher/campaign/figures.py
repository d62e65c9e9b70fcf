"""A goal campaign's figures, each with its data beside it (``<name>.csv``), in the campaign's figures/.

- ``progress.png``: the incumbent's objective (its arm's mean AUC in each comparison that measured it)
  against the CPU-hours spent so far, with each round's tested changes marked (filled: held) and each
  screen's arms in grey;
- ``forest.png``: every screen's main effects (95% intervals) and every confirmation's effect with its
  interval at the level it was tested, by round and outcome; the headline's verification last.

Both are written from the first screen on, so a campaign whose screen flagged nothing still shows why: its
effects and how wide their intervals were.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from researcher.campaign.discovery import Screened, Test
from researcher.campaign.record import CampaignRecord
from researcher.evidence import curves
from researcher.evidence.plots import PAGE_PX, pyplot, save


@dataclass(frozen=True)
class Point:
    """One row: a confirmation, a screen's main effect or a screen's arm, with the CPU-hours spent when its
    stage ended."""

    round: int
    kind: str  # confirm | combine | verify | screen (an effect) | screen arm
    changes: str
    cpu_hours: float
    objective: float | None  # the incumbent after it: a combination that held, verify's incumbent, else the control
    tested: float | None     # the changed arm's objective (a screen arm: its own)
    diff: float
    low: float
    high: float
    alpha: float  # two-sided for a screen's effects (95%), one-sided for a confirmation
    held: bool    # a confirmation held; a screen's effect was flagged


def _points(rec: CampaignRecord) -> list[Point]:
    d = rec.discovery
    if d is None:
        return []
    spent, out = 0.0, []
    tests, screens = iter(d.tests), iter(d.screens)
    for claim in rec.claims:
        spent += claim.cpu_hours
        if claim.stage is None or not claim.recorded:
            continue
        if claim.stage.kind == "screen":
            screened = next(screens, None)
            if screened is not None:
                out += _screen_points(screened, round(spent, 4), d.min_effect)
            continue
        if claim.stage.alpha is None:
            continue
        t: Test | None = next(tests, None)
        if t is None:
            break
        kept = t.treatment if (t.held and t.kind == "combine") or t.kind == "verify" else t.control
        out.append(Point(t.round, t.kind, ", ".join(f"{c.knob}={c.value}" for c in t.changes), round(spent, 4), kept,
                         t.treatment, t.diff, t.low, t.high, t.alpha, t.held))
    return out


def _screen_points(screened: Screened, spent: float, min_effect: float) -> list[Point]:
    nan = math.nan
    rows = [Point(screened.round, "screen arm", config, spent, None, mean, nan, nan, nan, nan, False)
            for config, mean in screened.arms.items()]
    for e in screened.effects:
        hw = e.hw if e.hw is not None else math.inf
        rows.append(Point(screened.round, "screen", f"{e.knob}: {e.low} -> {e.high}", spent, None, None, e.estimate,
                          e.estimate - hw, e.estimate + hw, 0.05, e.resolved and abs(e.estimate) > min_effect))
    return rows


def write(rec: CampaignRecord, folder: Path) -> list[Path]:
    """progress.png and forest.png (with their CSVs) under ``folder``; nothing before the first screen ends."""
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
    arms = [r for r in rows if r.kind == "screen arm"]
    ax.scatter([r.cpu_hours for r in arms], [r.tested for r in arms], color="C7", s=10, label="a screen's arms")
    for r in rows:
        if r.tested is not None and r.kind != "screen arm":
            ax.scatter(r.cpu_hours, r.tested, color="C2" if r.held else "white", edgecolors="C2", zorder=3)
            ax.annotate(f"r{r.round} {r.kind}", (r.cpu_hours, r.tested), fontsize=6, textcoords="offset points",
                        xytext=(3, 3))
    ax.set_xlabel("CPU-hours spent")
    ax.set_ylabel("objective (AUC)")
    ax.set_title("the incumbent, each tested change (filled: held) and each screen's arms", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    written.append(save(plt, fig, folder / "progress.png", data))
    effects = [r for r in rows if r.kind != "screen arm"]
    fig, ax = plt.subplots(figsize=(PAGE_PX / 100, 1.2 + 0.3 * len(effects)), dpi=100)
    for y, r in enumerate(reversed(effects)):
        low, high = (v if math.isfinite(v) else r.diff for v in (r.low, r.high))  # no interval: the point alone
        color = ("C0" if r.held else "C7") if r.kind == "screen" else ("C2" if r.held else "C7")
        ax.plot([low, high], [y, y], color=color, linewidth=2)
        ax.plot(r.diff, y, marker="s" if r.kind == "screen" else "o", color=color)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(effects)), [f"r{r.round} {r.kind}: {r.changes}"[:60] for r in reversed(effects)],
                  fontsize=6)
    ax.set_xlabel("effect on the objective (AUC): screens at 95%, confirmations at their test's level", fontsize=7)
    ax.set_title("screen effects (squares; blue: flagged), confirmations (circles; green: held)", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    written.append(save(plt, fig, folder / "forest.png", data))
    return written
