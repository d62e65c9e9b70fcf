"""A study session: start a study's graph or resume it, under the study's one-writer file lock.

``start_study`` and ``resume_study`` are what the CLI's verbs call: the study prepared
(``researcher.session.preparation``: settings, options, data, context and their checks), then run.

The graph is checkpointed to ``artifacts/<id>/graph.db`` (SQLite, ``durability="sync"`` so a hard
kill loses no finished node) with thread id = study id. Resume re-enters the graph with
``invoke(None)``, after closing the MLflow runs a crash left RUNNING that nothing re-attaches to.
The lock, the read-only state and the stop request live in ``researcher.study.store`` (which loads
no graph, for the readers that must not).

A full disk ends a session parked, never with a traceback: a node's write the disk refused parks the
study in the graph (``researcher.session.graph``), and a write outside the nodes (LangGraph's own checkpoint
after a node, LOG.md, the session's bookkeeping) ends the session here with a ``disk_full`` event and
the parked ending; the graph's last checkpoint stands, so a resume once there is room runs on from it
(the step whose checkpoint was refused runs again). The study's runs, in sessions of their own, train on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from researcher.runs import record as runs
from researcher.runs import smoke
from researcher.session.composition import Emit
from researcher.session.context import StudyContext
from researcher.session.graph import build
from researcher.session.preparation import Prepared, StartRequest, prepare_resume, prepare_start
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState
from researcher.study.store import StudyNotFound, checkpointer, config_for, read_state, study_lock
from researcher.types.failures import is_disk_full
from researcher.types.settings import StudyOptions
from researcher.types.usage import new_usage

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph

log = logging.getLogger(__name__)
ENDED_PHASES = ("done", "failed", "stopped")
SPOOL_WAIT_S = 60.0  # how long an ended study's session waits for MLflow to take its spooled writes


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, ``swarm.stopping``) while a study's session ran: its last checkpoint stands."""

    def __init__(self, study_id: str) -> None:
        super().__init__(study_id)
        self.study_id = study_id


def start_study(request: StartRequest, printer: Emit | None = None,
                announce: Callable[[Prepared], None] | None = None) -> tuple[StudyState, StudyLayout]:
    """``researcher start``: prepare the study (refusals are ``preparation.Refused``), show it to
    ``announce``, then start it; its ending state and layout. ``Interrupted`` once it has begun."""
    prepared = prepare_start(request, printer)
    if announce is not None:
        announce(prepared)
    try:
        return start(prepared.ctx, prepared.topic, prepared.options, prepared.deadline), prepared.ctx.layout
    except KeyboardInterrupt:
        raise Interrupted(prepared.ctx.layout.study_id) from None


def resume_study(study_id: str, studies_dir: Path, artifacts_dir: Path, printer: Emit | None = None,
                 window_s: float | None = None) -> StudyState:
    """``researcher resume``: continue a study by id, for ``window_s`` seconds if given (then it parks)."""
    return resume(prepare_resume(study_id, studies_dir, artifacts_dir, printer, window_s))


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
        try:
            studyfiles.write_study_toml(layout, topic, ctx.planner.name, options.model_dump(), deadline)
            ctx.say("session", action="start", pid=os.getpid(), planner=ctx.planner.name)
            state = initial_state(layout.study_id, topic, options, deadline, ctx.clock())
            ctx.llm_deadline.set(deadline, state["budget"]["report_reserve_s"])
            return _invoke(ctx, state, fresh=True)
        except Exception as exc:  # a write before the graph's first checkpoint (_invoke handles the rest)
            if not is_disk_full(exc):
                raise
            return _out_of_space(ctx, exc, {}, fresh=True)


def resume(ctx: StudyContext) -> StudyState:
    layout = ctx.layout
    if not layout.graph_db.is_file():
        raise StudyNotFound(f"no study {layout.study_id!r} under {layout.artifacts_root}")
    with study_lock(layout):
        try:
            return _resume(ctx)
        except Exception as exc:  # a write before the graph runs (_invoke handles the rest)
            if not is_disk_full(exc):
                raise
            return _out_of_space(ctx, exc, _read_or_none(layout))


def _resume(ctx: StudyContext) -> StudyState:
    layout = ctx.layout
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


def _invoke(ctx: StudyContext, state: StudyState | None, fresh: bool = False) -> StudyState:
    """Run the graph from ``state`` (None: on from its last checkpoint); ``fresh``: a new study's first run."""
    with checkpointer(ctx.layout) as saver:
        graph = build(ctx).compile(checkpointer=saver)
        config = config_for(ctx.layout.study_id)
        try:
            return _run(ctx, graph, config, state)
        except Exception as exc:  # LangGraph's checkpoint after a node, or a write of the session's own
            if not is_disk_full(exc):
                raise
            return _out_of_space(ctx, exc, _last_checkpoint(graph, config), fresh)


def _run(ctx: StudyContext, graph: CompiledStateGraph, config: RunnableConfig, state: StudyState | None) -> StudyState:
    if state is None:
        snap = graph.get_state(config)
        if not snap.values:
            raise StudyNotFound(f"study {ctx.layout.study_id!r} has no checkpoint (its start never ran a step): "
                                "start it again")
        phase = snap.values.get("phase")
        if not snap.next and not snap.tasks and phase in ENDED_PHASES:
            deliver_spool(ctx)  # already complete: only MLflow writes that waited for the store are left
            return cast(StudyState, snap.values)
        if tuple(snap.next) in (("park",), ()):
            # The last session stopped while parking (its checkpoint refused, or killed), or its park
            # could not finish (a full disk): this one enters where the study was, not parking at once.
            state = cast(StudyState, {"phase": phase, "parked": None})
    started = time.monotonic()
    result = graph.invoke(state, config, durability="sync")
    log.info("study %s graph returned after %.1f s", ctx.layout.study_id, time.monotonic() - started)
    if result.get("phase") in ENDED_PHASES:
        deliver_spool(ctx)
    return cast(StudyState, result)  # the compiled graph's output is its state (langgraph types it as a dict)


def _last_checkpoint(graph: CompiledStateGraph, config: RunnableConfig) -> StudyState | None:
    """The graph's last checkpointed state, read on the session's open connection ({} when there is
    none); None when even that read fails (a full disk can refuse SQLite's shared-memory file)."""
    try:
        return cast(StudyState, graph.get_state(config).values)
    except Exception as exc:
        log.warning("could not read the last checkpoint: %s", exc)
        return None


def _read_or_none(layout: StudyLayout) -> StudyState | None:
    try:
        return read_state(layout) or {}
    except Exception as exc:  # the disk that refused a write can refuse this read too (see above)
        log.warning("could not read the last checkpoint of %s: %s", layout.study_id, exc)
        return None


def _out_of_space(ctx: StudyContext, exc: BaseException, saved: StudyState | None, fresh: bool = False) -> StudyState:
    """The session's ending when a write outside the nodes found the disk full (see the module docstring):
    the study as last checkpointed (``saved``; {} when nothing was, None when it cannot be read), shown
    parked. Nothing here needs room: the event and LOG.md are best effort (a warning on stderr if refused)."""
    layout = ctx.layout
    error = f"{type(exc).__name__}: {exc}"[:300]
    ctx.say("disk_full", node=None, error=error)  # the recorder logs a warning if the disk refuses it too
    if fresh and saved == {}:  # a start that checkpointed nothing: the study never began, a new start is the way on
        layout.graph_db.unlink(missing_ok=True)
        layout.study_toml.unlink(missing_ok=True)
        return {"phase": "failed", "error": f"the disk is full ({error}); nothing of study {layout.study_id} "
                                            "was kept: free some space and start it again"}
    held = ctx.tracker.spool.held if ctx.tracker.spool else 0
    lost = f"; {held} MLflow write(s) the spool could not keep are lost" if held else ""
    if saved is not None and saved.get("phase") in ENDED_PHASES:
        log.warning("study %s ended, but the disk is full: %s%s", layout.study_id, error, lost)
        return saved
    phase = (saved or {}).get("phase") or "framing"
    if phase == "parked":
        phase = ((saved or {}).get("parked") or {}).get("phase", "framing")
    reason = (f"disk full ({error}){lost}; free some space under {layout.artifacts_dir.parent} and "
              f"{layout.study_dir.parent}, then `researcher resume {layout.study_id}` continues from the last "
              "checkpoint (its runs train on meanwhile)")
    log.warning("study %s parked: %s", layout.study_id, reason)
    try:
        studyfiles.log(layout, f"Parked in phase {phase}: {reason}.")
    except OSError as refused:
        log.warning("could not write LOG.md of %s: %s", layout.study_id, refused)
    return cast(StudyState, {**(saved or {}), "phase": "parked",
                             "parked": {"phase": phase, "reason": reason, "at": time.time(), "runs": []}})


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

