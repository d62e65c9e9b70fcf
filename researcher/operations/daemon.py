"""``researcher daemon``: run the scheduler in the foreground and resume studies on their schedules.

On start, and every ``poll_s`` seconds, the daemon syncs the job store with the studies' schedule
files: a job missing from the store is added, a job whose study lost its schedule file is removed,
and a stored job with an unchanged spec is left alone (so its stored next run time survives a
restart, and a run missed while the daemon was down runs once, coalesced). The periodic sync also
makes the daemon notice jobs that ``researcher schedule`` added from another process.

Beside the scheduler, on a thread, the daemon serves every study's event log as Server-Sent Events
on loopback (``GET /studies/{id}/events``, bearer token in ``<artifacts>/daemon.token``; see
``researcher.operations.events_http``), unless ``port`` is None.

SIGTERM or Ctrl-C stops the scheduler, then the study sessions it runs (each ends as on its own
Ctrl-C; their runs train on for the next session), then the events server, within
``swarm.stopping``'s deadline. A SIGKILLed daemon leaves its sessions running.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from researcher.operations import scheduler as sched
from researcher.types.failures import is_disk_full
from swarm import stopping

log = logging.getLogger(__name__)


def sync_jobs(scheduler: Any, studies_root: Path, artifacts_root: Path) -> dict[str, list[str]]:
    """Make the store match the schedule files; returns the study ids added and removed."""
    specs = sched.read_schedules(studies_root)
    added, removed = [], []
    for study_id, spec in specs.items():
        existing = scheduler.get_job(sched.job_id(study_id), jobstore="default")
        if existing is None or existing.name != spec.key:
            # None: a one-shot whose time has passed (firing now, its file not yet spent): not added.
            if sched.add_job(scheduler, study_id, spec, studies_root, artifacts_root, replace=True) is not None:
                added.append(study_id)
    for job in scheduler.get_jobs(jobstore="default"):
        if job.id.startswith("resume:") and job.id.split(":", 1)[1] not in specs:
            scheduler.remove_job(job.id, jobstore="default")
            removed.append(job.id.split(":", 1)[1])
    if added or removed:
        log.info("schedule sync: added %s, removed %s", added or "-", removed or "-")
    return {"added": added, "removed": removed}


def _history_writer(artifacts_root: Path) -> Any:
    path = artifacts_root / sched.HISTORY_FILE
    lock = threading.Lock()

    def on_event(event: Any) -> None:
        if not str(getattr(event, "job_id", "")).startswith("resume:"):
            return
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED

        kind = {EVENT_JOB_MISSED: "missed", EVENT_JOB_ERROR: "error"}.get(event.code, "executed")
        row: dict[str, Any] = {"job_id": event.job_id, "event": kind,
                               "scheduled_for": event.scheduled_run_time.isoformat(timespec="seconds"),
                               "logged_at": dt.datetime.now().astimezone().isoformat(timespec="seconds")}
        if kind == "executed" and isinstance(event.retval, dict):
            row.update(event.retval)
        if kind == "error":
            row["error"] = repr(event.exception)
        with lock, open(path, "a") as out:
            out.write(json.dumps(row, default=str) + "\n")

    return on_event


def tolerant_store(url: str) -> Any:
    """APScheduler's SQLite job store, except that a full disk refusing a job's write is logged, not
    raised: after a job fires, APScheduler stores its next run time from inside its main loop, where an
    error ends the loop and with it the daemon. Skipped, the job keeps its stored time and fires again
    when due (one instance at a time); the write succeeds once there is room."""
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    class DiskTolerantJobStore(SQLAlchemyJobStore):
        def update_job(self, job: Any) -> None:
            self._tolerated(super().update_job, job, "store the next run time of")

        def remove_job(self, job_id: str) -> None:
            self._tolerated(super().remove_job, job_id, "remove")

        @staticmethod
        def _tolerated(write: Callable[[Any], None], what: Any, doing: str) -> None:
            try:
                write(what)
            except Exception as exc:
                if not is_disk_full(exc):
                    raise
                log.warning("the disk is full: could not %s job %s (%s); the daemon goes on", doing,
                            getattr(what, "id", what), exc)

    return DiskTolerantJobStore(url=url)


def run_daemon(studies_root: Path, artifacts_root: Path, poll_s: float = 30.0, port: int | None = None,
               announce: Callable[[str], None] = log.info) -> None:
    """Block running the scheduler (and the events server on ``port``, 0 = a free one) until SIGINT/SIGTERM."""
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.blocking import BlockingScheduler

    studies_root, artifacts_root = studies_root.resolve(), artifacts_root.resolve()
    # APScheduler logs every run of the frequent sync job at INFO; our own lines cover study sessions.
    logging.getLogger("apscheduler.executors.default").setLevel(logging.WARNING)
    artifacts_root.mkdir(parents=True, exist_ok=True)
    scheduler = BlockingScheduler(
        jobstores={"default": tolerant_store(sched.store_url(artifacts_root)), "internal": MemoryJobStore()},
        executors={"default": ThreadPoolExecutor(8)}, job_defaults=sched.job_defaults())
    scheduler.add_listener(_history_writer(artifacts_root), EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED)
    scheduler.add_job(sync_jobs, "interval", seconds=poll_s, id="sync", jobstore="internal",
                      args=[scheduler, studies_root, artifacts_root], misfire_grace_time=None, coalesce=True)
    server = None
    if port is not None:
        from researcher.operations.events_http import EventServer

        server = EventServer(studies_root, artifacts_root, port)
        server.start()
        announce(f"study events: {server.url}/studies/<study>/events (SSE; bearer token in {server.token_file})")

    def stop(signum: int, frame: Any) -> None:
        stopping.on_stop_signal(signum)  # exits within the deadline whatever hangs; a second signal at once
        log.info("signal %d: shutting the scheduler down and stopping the sessions it runs", signum)
        scheduler.shutdown(wait=False)
        if server is not None:
            server.stop(timeout_s=0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Sync once through a paused scheduler on the same store before the loop starts, so due
    # (missed) jobs run right away and the loop sees the final jobs.
    with sched.open_store(artifacts_root) as paused:
        sync_jobs(paused, studies_root, artifacts_root)
        for job in paused.get_jobs():
            log.info("job %s next run %s", job.id, job.next_run_time)
    log.info("daemon running (store %s, sync every %.0f s)", sched.store_url(artifacts_root), poll_s)
    try:
        scheduler.start()  # blocks until shutdown
    finally:
        stopping.stop_children(grace_s=sched.SESSION_STOP_S)  # the sessions' jobs return, so the daemon exits
        if server is not None:
            server.stop()
