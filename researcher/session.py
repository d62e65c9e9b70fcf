"""A study session: start a study's graph or resume it, under the study's one-writer file lock.

The graph is checkpointed to ``artifacts/<id>/graph.db`` (SQLite, ``durability="sync"`` so a hard
kill loses no finished node) with thread id = study id. Resume re-enters the graph with
``invoke(None)``, after closing the MLflow runs a crash left RUNNING that nothing re-attaches to.
The lock, the read-only state and the stop request live in ``researcher.study.store`` (which loads
no graph, for the readers that must not).
"""

from __future__ import annotations

import logging
import os
import time
from typing import cast

from researcher.context import StudyContext
from researcher.graph import build
from researcher.planner.usage import new_usage
from researcher.runs import record as runs
from researcher.runs import smoke
from researcher.settings import StudyOptions
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.state import StudyState
from researcher.study.store import StudyNotFound, checkpointer, config_for, read_state, study_lock

log = logging.getLogger(__name__)
ENDED_PHASES = ("done", "failed", "stopped")
SPOOL_WAIT_S = 60.0  # how long an ended study's session waits for MLflow to take its spooled writes


def initial_state(study_id: str, topic: str, options: StudyOptions, deadline: float, now: float) -> StudyState:
    return {"study_id": study_id, "topic": topic, "phase": "framing", "options": options.model_dump(),
            "budget": budget.make_budget(now, deadline, max_runs=options.max_runs,
                                         max_iterations=options.max_iterations, max_repairs=options.max_repairs,
                                         max_llm_tokens=options.max_llm_tokens,
                                         max_llm_cost_usd=options.max_llm_cost_usd),
            "iteration": 0, "trials": [], "runs_launched": 0, "run_seconds": [], "iterations": [],
            "llm": new_usage(), "mlflow_parent_run": None, "error": None}


def start(ctx: StudyContext, topic: str, options: StudyOptions, deadline: float) -> StudyState:
    layout = ctx.layout
    if layout.graph_db.is_file() or layout.study_toml.is_file():
        raise FileExistsError(f"study {layout.study_id} already exists; use `researcher resume {layout.study_id}` "
                              "or pick another --study-id")
    layout.ensure()
    with study_lock(layout):
        studyfiles.write_study_toml(layout, topic, ctx.planner.name, options.model_dump(), deadline)
        ctx.say("session", action="start", pid=os.getpid(), planner=ctx.planner.name)
        state = initial_state(layout.study_id, topic, options, deadline, ctx.clock())
        ctx.llm_deadline.set(deadline, state["budget"]["report_reserve_s"])
        return _invoke(ctx, state)


def resume(ctx: StudyContext) -> StudyState:
    layout = ctx.layout
    if not layout.graph_db.is_file():
        raise StudyNotFound(f"no study {layout.study_id!r} under {layout.artifacts_root}")
    with study_lock(layout):
        layout.stop_file.unlink(missing_ok=True)  # resuming clears an earlier stop request
        if smoke.stop_leftovers(layout.artifacts_dir / "smoke"):
            log.warning("stopped a smoke-run server left by a killed session of %s", layout.study_id)
        ctx.say("session", action="resume", pid=os.getpid(), planner=ctx.planner.name)
        state = read_state(layout)
        if state is not None:
            if state.get("budget"):  # the study's deadline binds this session's LLM calls too
                ctx.llm_deadline.set(state["budget"]["deadline"], state["budget"]["report_reserve_s"])
            keep = {r.mlflow_run_id for r in runs.all_records(layout.runs_dir) if not r.ended and r.mlflow_run_id}
            if state.get("phase") not in ("analyzing", "deciding", "reporting", "done", "failed", "stopped"):
                keep.add(state.get("mlflow_parent_run") or "")
            ctx.tracker.close_stale(layout.study_id, keep)
            until = "" if ctx.window_end is None else time.strftime("%H:%M:%S", time.localtime(ctx.window_end))
            window = f", window until {until}" if until else ""
            studyfiles.log(layout, f"Resumed (phase {state.get('phase')}, iteration {state.get('iteration')}{window}).")
            if state.get("phase") == "parked":
                # The parked session's graph run ended at `park`: start a new one, entering where it parked.
                parked = state.get("parked") or {}
                return _invoke(ctx, {"phase": parked.get("phase", "framing"), "parked": None})
        return _invoke(ctx, None)


def _invoke(ctx: StudyContext, state: StudyState | None) -> StudyState:
    with checkpointer(ctx.layout) as saver:
        graph = build(ctx).compile(checkpointer=saver)
        config = config_for(ctx.layout.study_id)
        if state is None:
            snap = graph.get_state(config)
            if not snap.next and not snap.tasks:
                deliver_spool(ctx)  # already complete: only MLflow writes that waited for the store are left
                return cast(StudyState, snap.values)
        started = time.monotonic()
        result = graph.invoke(state, config, durability="sync")
        log.info("study %s graph returned after %.1f s", ctx.layout.study_id, time.monotonic() - started)
        if result.get("phase") in ENDED_PHASES:
            deliver_spool(ctx)
        return cast(StudyState, result)  # the compiled graph's output is its state (langgraph types it as a dict)


def deliver_spool(ctx: StudyContext, wait_s: float = SPOOL_WAIT_S, every_s: float = 5.0) -> bool:
    """Deliver the MLflow writes an ended study spooled while the store was away: nothing later would
    (a study's next session replays them, and an ended study has none). Retried for ``wait_s``; what
    is left after that is named in LOG.md with the command that delivers it. True when none is left."""
    deadline = time.monotonic() + wait_s
    while not ctx.tracker.flush(force=True):
        if time.monotonic() >= deadline:
            folder = ctx.tracker.spool.folder if ctx.tracker.spool else ""
            note = (f"MLflow did not answer at the end of the session: its writes wait in {folder}; "
                    f"`researcher resume {ctx.layout.study_id}` delivers them once it does.")
            log.warning(note)
            studyfiles.log(ctx.layout, note)
            return False
        time.sleep(every_s)
    return True

