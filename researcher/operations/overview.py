"""The overview of studies on disk, one row a study (``researcher status`` and ``list``): phase,
iteration, run counts, deadline, whether a process is running it now, its next scheduled session
and the current answer. Reads files only; it never loads the study graph.

``summary`` is the JSON-ready row (``status --json``); ``readable`` renders the same row as words for
people (``6 launched: 4 finished, 2 running``), never a Python dict."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from researcher.findings import verdicts
from researcher.findings.records import IterationSummary, LookPlan, SequentialDesign
from researcher.operations import scheduler
from researcher.runs import record as runs
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState, last_summary, study_options
from researcher.study.store import is_locked, read_state


def summary(layout: StudyLayout) -> dict[str, Any]:
    state: StudyState = read_state(layout) or {}
    records = runs.all_records(layout.runs_dir)
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
    budget = state.get("budget")
    deadline = budget["deadline"] if budget else None
    meta = studyfiles.read_study_toml(layout).get("study")
    meta = meta if isinstance(meta, dict) else {}
    answer = None
    last = last_summary(state)
    if last is not None:
        answer = f"{standing(last, study_options(state).min_effect)}: {last.best} ({last.knob}={last.best_value})"
    reported = report_answer(layout)
    if reported is not None:
        answer = reported[:400]
    plan = studyfiles.read_plan(layout)
    current = plan.iteration(state.get("iteration", 0))
    return {
        "study_id": layout.study_id,
        "topic": state.get("topic") or meta.get("topic"),
        "state": state.get("phase", "unknown"),
        "active": is_locked(layout),
        "iteration": state.get("iteration", 0),
        "runs": {"launched": sum(1 for r in records if r.launches), "by_status": counts},
        "deadline": dt.datetime.fromtimestamp(deadline, dt.UTC).isoformat(timespec="seconds")
        if deadline else None,
        "decision": state.get("decision"),
        "llm": state.get("llm"),
        "error": state.get("error"),
        "parked": (state.get("parked") or {}).get("reason") if state.get("phase") == "parked" else None,
        "answer": answer,
        "report": str(layout.report_md) if layout.report_md.is_file() else None,
        "placements": placements(records, time.time()),
        # This iteration's arms with the steps and episodes each trains (matched on episodes where they differ).
        "arms": [{"name": e.name, "steps": e.steps, "episodes": e.episodes, "eval_every": e.eval_every}
                 for e in current.experiments if e.steps],
        "looks": describe_looks(plan.design, current.look),
    }


def report_answer(layout: StudyLayout) -> str | None:
    """The Answer paragraph of the study's report.md (None before the report)."""
    if not layout.report_md.is_file():
        return None
    parts = layout.report_md.read_text().split("## Answer", 1)
    return parts[1].strip().split("\n\n", 1)[0] if len(parts) == 2 else None


def describe_looks(design: SequentialDesign | None, look: LookPlan | None) -> str | None:
    """Where the study stands among its registered looks, and its sizing from the pilot."""
    if design is None or look is None:
        return None
    kind = "the pilot" if look.fraction is None else ("the last" if look.fraction >= 1 else "an interim look")
    return f"look {look.look} of up to {design.looks} ({kind}, {look.seeds} seeds an arm)" + (
        f"; {design.sizing}" if design.sizing else "")


def standing(summary: IterationSummary, min_effect: float) -> str:
    """How the current leader stands, by the verdict rules: never "best" from an unsettled comparison.
    ``min_effect``: the study's, for a summary whose evidence does not record the one it was judged by."""
    c, study = summary.comparison, summary.study
    if c is None:
        return "best so far"
    if study is not None and study.short:
        return "leading so far (no verdict: too few points in an arm's window)"
    if study is not None and "min_effect" in study.model_fields_set:
        min_effect = study.min_effect
    verdict = verdicts.classify(c.diff, c.hw, min_effect)
    return "best so far" if verdicts.resolved(verdict) else f"leading so far ({verdict.lower()})"


def placements(records: list[runs.RunRecord], now: float) -> list[dict[str, Any]]:
    """Where each run is: ``placement`` (local | ray | external), ``node``, the ``resources`` it asks for,
    its local GPUs (``devices``) and ``queued_s``, the time it waited for them (still counting while it waits)."""
    return [{"key": r.key, "status": "queued" if r.queued_at is not None and not r.ended else r.status,
             "placement": r.placement, "node": r.node, "resources": r.resources, "devices": r.devices,
             "queued_s": round(r.queued_s + (now - r.queued_at if r.queued_at is not None and not r.ended else 0.0), 1)}
            for r in records]


def study_ids(studies_root: Path, artifacts_root: Path) -> list[str]:
    """Studies known on disk: a study.toml in studies/ or a graph.db in artifacts/."""
    ids = set()
    if studies_root.is_dir():
        ids |= {p.parent.name for p in studies_root.glob("*/study.toml")}
    if artifacts_root.is_dir():
        ids |= {p.parent.name for p in artifacts_root.glob("*/graph.db")}
    return sorted(ids - {"examples"})


def add_wakeups(rows: list[dict[str, Any]], artifacts_root: Path) -> list[dict[str, Any]]:
    """Mark each row with whether the study is scheduled and its next session, from the job store."""
    wakeups = scheduler.next_wakeups(artifacts_root) if rows else {}
    for row in rows:
        when = wakeups.get(row["study_id"])
        row["scheduled"] = row["study_id"] in wakeups
        row["next_wakeup"] = when.isoformat(timespec="seconds") if when else None
    return rows


# The lifecycle order a run's statuses are listed in (see ``runs.RunRecord.status``).
_STATUS_ORDER = ("finished", "running", "parked", "pending", "crashed", "stalled", "diverged", "cut", "stopped")
_SHOWN = ("topic", "state", "parked", "active", "iteration", "arms", "looks", "runs", "deadline", "next_wakeup",
          "decision", "answer", "error")


def describe_runs(runs: dict[str, Any]) -> str:
    """``{"launched": 6, "by_status": {"running": 2, "finished": 4}}`` -> ``6 launched: 4 finished, 2 running``."""
    counts: dict[str, int] = runs.get("by_status") or {}
    if not counts:
        return "none yet"
    order = [s for s in _STATUS_ORDER if s in counts] + sorted(set(counts) - set(_STATUS_ORDER))
    return f"{runs.get('launched', 0)} launched: " + ", ".join(f"{counts[s]} {s}" for s in order)


def describe_decision(decision: dict[str, Any]) -> str:
    """``{"action": "continue", "reason": "..."}`` -> ``continue: ...``."""
    action, reason = decision.get("action"), decision.get("reason")
    return f"{action}: {reason}" if action and reason else str(action or reason or "")


def readable(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The (field, text) lines ``researcher status`` shows for one ``summary`` row; empty fields are left out."""
    lines = []
    for key in _SHOWN:
        value = row.get(key)
        if value in (None, "", {}):
            continue
        if key == "runs":
            text = describe_runs(value)
        elif key == "arms":
            text = "; ".join(f"{a['name']}: {a['steps']} steps, {a['episodes']} episodes" for a in value)
        elif key == "decision" and isinstance(value, dict):
            text = describe_decision(value)
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        else:
            text = str(value)
        lines.append((key, text))
    return lines
