"""The overview of studies on disk, one row a study (``researcher status`` and ``list``): phase,
iteration, run counts, deadline, whether a process is running it now, its next scheduled session
and the current answer. Reads files only; it never loads the study graph."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from researcher import runs, scheduler, studyfiles
from researcher.layout import StudyLayout
from researcher.studystore import is_locked, read_state


def summary(layout: StudyLayout) -> dict[str, Any]:
    state = read_state(layout) or {}
    records = runs.all_records(layout.runs_dir)
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
    deadline = (state.get("budget") or {}).get("deadline")
    meta = studyfiles.read_study_toml(layout).get("study", {})
    answer = None
    history = state.get("iterations") or []
    if history:
        best = history[-1]
        answer = f"best so far: {best.get('best')} ({best.get('knob')}={best.get('best_value')})"
    if layout.report_md.is_file():
        lines = layout.report_md.read_text().split("## Answer", 1)
        if len(lines) == 2:
            answer = lines[1].strip().split("\n\n", 1)[0][:400]
    return {
        "study_id": layout.study_id,
        "topic": state.get("topic") or meta.get("topic"),
        "state": state.get("phase", "unknown"),
        "active": is_locked(layout),
        "iteration": state.get("iteration", 0),
        "runs": {"launched": sum(1 for r in records if r.launches), "by_status": counts},
        "deadline": dt.datetime.fromtimestamp(deadline, dt.timezone.utc).isoformat(timespec="seconds")
        if deadline else None,
        "decision": state.get("decision"),
        "llm": state.get("llm"),
        "error": state.get("error"),
        "parked": (state.get("parked") or {}).get("reason") if state.get("phase") == "parked" else None,
        "answer": answer,
        "report": str(layout.report_md) if layout.report_md.is_file() else None,
    }


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
