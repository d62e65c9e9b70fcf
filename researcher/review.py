"""The one place the review data of studies is computed (``researcher status``, ``list``, and a
future scheduler's review table): phase, iteration, run counts, deadline, whether a process is
running it now, and the current answer."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from researcher import runs, studyfiles
from researcher.layout import StudyLayout
from researcher.study import read_state


def is_locked(layout: StudyLayout) -> bool:
    if not layout.lock_file.exists():
        return False
    lock = FileLock(str(layout.lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


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
