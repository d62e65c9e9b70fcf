"""Scheduled resumption of studies: APScheduler 3 with a SQLAlchemy SQLite job store.

Each scheduled study has one job, id ``resume:<study_id>``, in ``<artifacts>/scheduler.db``; the job
is referenced by text (``researcher.operations.scheduler:run_scheduled_resume``) so the store can be reloaded
by a fresh daemon (jobs stored before this module moved name ``researcher.scheduler:run_scheduled_resume``,
which ``researcher/scheduler.py`` still resolves). Jobs use ``coalesce=True`` (several missed times run once), ``max_instances=1``
and ``misfire_grace_time=None`` (APScheduler's default of 1 s would silently skip a run missed
while the machine was off). The schedule itself is also kept in ``studies/<id>/schedule.toml``, the
reviewable source of truth: the daemon re-adds a job missing from the store on start and every
``poll`` seconds, but never replaces a stored job with the same spec (that would recompute its
next run time and lose a missed run).

A job runs one study session as a subprocess (``researcher resume ID --window …``; for a campaign's
folder, ``researcher campaign resume ID --window …``), so a crashing
study cannot take the daemon down; a study whose lock is held (a session already running) is
skipped with a log line. Every fire is appended to ``<artifacts>/scheduler-history.jsonl``.

``--at`` with an ISO date-time (``2026-12-01T02:00``, local time unless it names an offset) and no
``--every`` is a one-shot (APScheduler's ``DateTrigger``): APScheduler drops the job once it fires,
the job's first act is to delete the study's schedule file (the schedule is spent), and a spent
one-shot is never added to the store again, so a daemon's sync cannot make it fire twice. A
one-shot missed while no daemon ran stays in the store and runs when one starts (like any job).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.study.store import is_locked, read_state
from swarm import stopping
from swarm.atomic import write_atomic

log = logging.getLogger(__name__)

JOB_FUNC = "researcher.operations.scheduler:run_scheduled_resume"
SCHEDULE_FILE = "schedule.toml"
HISTORY_FILE = "scheduler-history.jsonl"
STORE_FILE = "scheduler.db"
CAMPAIGN_FILE = "campaign.json"  # researcher.campaign.record.CAMPAIGN_FILE
SESSION_GRACE_S = 900.0  # a session may overrun its window by this much (finishing a node) before it is killed
SESSION_STOP_S = 5.0  # a session being stopped gets this long after SIGTERM (within the daemon's own deadline)


def job_id(study_id: str) -> str:
    return f"resume:{study_id}"


@dataclass(frozen=True)
class ScheduleSpec:
    """When a study resumes: daily ``at`` (HH:MM[:SS]) or once ``at`` an ISO date-time, a ``cron``
    (5 fields, or 6 with seconds first), or ``every`` seconds (first at ``at`` if given); each
    session lasts ``window_s``."""

    window_s: float
    at: str | None = None
    cron: str | None = None
    every_s: float | None = None

    def __post_init__(self) -> None:
        if self.cron and (self.at or self.every_s):
            raise ValueError("give --cron, or --at and/or --every, not both")
        if not (self.cron or self.at or self.every_s):
            raise ValueError("give --at HH:MM, --cron \"M H * * *\" or --every DURATION")
        if self.window_s <= 0:
            raise ValueError("the window must be positive")
        if self.every_s is not None and self.every_s <= 0:
            raise ValueError("--every must be positive")
        if self.at:
            _parse_at(self.at)
        if self.cron:
            self.trigger()  # validate now: a bad spec is refused before anything is written

    @property
    def key(self) -> str:
        """A stable text of the spec (the job's name): a changed spec replaces the stored job."""
        every = f"{float(self.every_s):g}" if self.every_s else ""
        return f"at={self.at or ''};cron={self.cron or ''};every={every};window={float(self.window_s):g}"

    @property
    def once(self) -> dt.datetime | None:
        """The moment of a one-shot schedule (``at`` a date-time, no ``every``); None for repeating ones."""
        return _parse_at(self.at) if self.at and not self.every_s else None

    def check_future(self, now: dt.datetime | None = None) -> None:
        """Refuse a one-shot time that has passed (when scheduling; a stored one that passed is spent)."""
        now = now or dt.datetime.now().astimezone()
        once = self.once
        if once is not None and once <= now:
            raise ValueError(f"--at {self.at} is in the past (now {now.isoformat(timespec='minutes')}); "
                             "give a future date-time")

    def trigger(self, now: dt.datetime | None = None) -> Any:
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.date import DateTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        now = now or dt.datetime.now().astimezone()
        if self.cron:
            fields = self.cron.split()
            try:
                if len(fields) == 5:
                    return CronTrigger.from_crontab(self.cron)
                if len(fields) == 6:
                    second, minute, hour, day, month, dow = fields
                    return CronTrigger(second=second, minute=minute, hour=hour, day=day, month=month,
                                       day_of_week=dow)
            except ValueError as exc:
                raise ValueError(f"invalid --cron {self.cron!r}: {exc}") from None
            raise ValueError(f"invalid --cron {self.cron!r}: use 5 fields (M H dom mon dow) or 6 with seconds first")
        moment = _parse_at(self.at) if self.at else None
        if self.every_s:
            # Anchored at ``at`` (today's HH:MM:SS, or the date-time; past or not): the trigger fires
            # on that grid from now on.
            start = moment or (clock_time_today(self.at, now) if self.at else now + dt.timedelta(seconds=self.every_s))
            return IntervalTrigger(seconds=self.every_s, start_date=start)
        if moment is not None:
            return DateTrigger(run_date=moment)
        clock = _parse_clock(self.at or "")
        return CronTrigger(hour=clock[0], minute=clock[1], second=clock[2])

    def to_toml(self) -> str:
        data = {k: v for k, v in {"at": self.at, "cron": self.cron, "every_s": self.every_s,
                                  "window_s": self.window_s}.items() if v is not None}
        return studyfiles.dumps_toml(data,
                                     "Written by `researcher schedule`; `researcher daemon` resumes the study "
                                     "at these times.")

    @classmethod
    def from_toml(cls, text: str) -> ScheduleSpec:
        data = tomllib.loads(text)
        return cls(window_s=float(data["window_s"]), at=data.get("at"), cron=data.get("cron"),
                   every_s=float(data["every_s"]) if data.get("every_s") else None)


def _parse_clock(text: str) -> tuple[int, int, int]:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        hour, minute, second = (int(p) for p in ([*parts, "0"])[:3])
        if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60):
            raise ValueError
    except ValueError:
        raise ValueError(f"cannot read --at {text!r}; use HH:MM or HH:MM:SS (24 h, local time)") from None
    return hour, minute, second


_CLOCK = re.compile(r"\d{1,2}:\d{1,2}(:\d{1,2})?")


def _parse_at(text: str) -> dt.datetime | None:
    """None for a daily clock time (HH:MM[:SS]); the aware moment of an ISO 8601 date-time."""
    if _CLOCK.fullmatch(text.strip()):
        _parse_clock(text.strip())
        return None
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"cannot read --at {text!r}; use HH:MM[:SS] (daily, 24 h local time) or an ISO "
                         "date-time such as 2026-12-01T02:00 (once)") from None
    if not re.search(r"[T ]\d", text.strip()):
        raise ValueError(f"--at {text!r} has no time of day; use e.g. {text.strip()}T02:00")
    return when if when.tzinfo is not None else when.astimezone()  # naive: local time


def clock_time_today(text: str, now: dt.datetime) -> dt.datetime:
    hour, minute, second = _parse_clock(text)
    return now.replace(hour=hour, minute=minute, second=second, microsecond=0)


def next_clock_time(text: str, now: dt.datetime) -> dt.datetime:
    """The next local time (today or tomorrow) at HH:MM[:SS]."""
    hour, minute, second = _parse_clock(text)
    when = now.replace(hour=hour, minute=minute, second=second, microsecond=0)
    return when if when > now else when + dt.timedelta(days=1)


# --------------------------------------------------------------------------- schedule files


def schedule_path(layout: StudyLayout) -> Path:
    return layout.study_dir / SCHEDULE_FILE


def write_schedule(layout: StudyLayout, spec: ScheduleSpec) -> None:
    write_atomic(schedule_path(layout), spec.to_toml())


def read_schedules(studies_root: Path) -> dict[str, ScheduleSpec]:
    """Every study's schedule file; an unreadable one is logged and left out (never fatal to the daemon)."""
    found: dict[str, ScheduleSpec] = {}
    if not studies_root.is_dir():
        return found
    for path in sorted(studies_root.glob(f"*/{SCHEDULE_FILE}")):
        try:
            found[path.parent.name] = ScheduleSpec.from_toml(path.read_text())
        except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
            log.warning("ignoring unreadable schedule %s: %s", path, exc)
    return found


# --------------------------------------------------------------------------- the job


def run_scheduled_resume(study_id: str, studies_dir: str, artifacts_dir: str, window_s: float,
                         once: str | None = None) -> dict[str, Any]:
    """One scheduled session: ``researcher resume ID --window`` as a subprocess, unless one is running.
    ``once``: the key of the one-shot spec this job was made for; its schedule file is spent now.

    Module-level and referenced by text, so APScheduler's SQLite job store can reload it."""
    layout = StudyLayout(study_id, Path(studies_dir), Path(artifacts_dir))
    if once is not None:
        _spend_one_shot(layout, once)
    campaign = _campaign(layout)  # a campaign's folder is scheduled like a study's
    phase = "done" if campaign is not None and campaign.get("ended") else (read_state(layout) or {}).get("phase")
    if phase in ("done", "failed", "stopped"):
        log.info("study %s is %s; nothing to resume (`researcher unschedule %s`)", study_id, phase, study_id)
        return {"study_id": study_id, "outcome": "skipped", "reason": f"study is {phase}"}
    if is_locked(layout):
        log.info("study %s is already being run (its lock is held); skipping this scheduled session", study_id)
        return {"study_id": study_id, "outcome": "skipped", "reason": "study lock held by another process"}
    verb = ["campaign", "resume"] if campaign is not None else ["resume"]
    argv = [sys.executable, "-m", "researcher.cli", *verb, study_id, "--window", f"{window_s:g}s",
            "--studies-dir", studies_dir, "--artifacts-dir", artifacts_dir]
    session_log = layout.artifacts_dir / "sessions.log"
    session_log.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    log.info("resuming study %s for a %.0f s window", study_id, window_s)
    with open(session_log, "ab") as out:
        out.write(f"\n=== scheduled session {dt.datetime.now().isoformat(timespec='seconds')} ===\n".encode())
        out.flush()
        # Own process group: a SIGKILLed daemon leaves a running session alone; a daemon stopped by
        # SIGTERM or Ctrl-C stops it (``stopping.stop_children``): the session ends as on Ctrl-C, its
        # runs train on, and the study's next session picks them up.
        proc = stopping.start_child(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=window_s + SESSION_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("study %s overran its window by %.0f s; terminating the session", study_id, SESSION_GRACE_S)
        finally:
            code = stopping.stop_child(proc, grace_s=SESSION_STOP_S)
    outcome = "ran" if code == 0 else "refused" if code == 2 else "failed"
    log.info("study %s session ended with code %s after %.0f s", study_id, code, time.time() - started)
    return {"study_id": study_id, "outcome": outcome, "exit_code": code, "seconds": round(time.time() - started, 1)}


def _campaign(layout: StudyLayout) -> dict[str, Any] | None:
    """The campaign.json of a campaign's folder (``researcher.campaign.record``, which imports this
    package's verbs: read here by name); None for a study's folder."""
    path = layout.study_dir / CAMPAIGN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _spend_one_shot(layout: StudyLayout, key: str) -> None:
    """Delete the study's schedule file if it still holds the one-shot that is firing now (a newer
    schedule written since stays)."""
    path = schedule_path(layout)
    try:
        if ScheduleSpec.from_toml(path.read_text()).key == key:
            path.unlink()
            log.info("one-shot schedule of study %s is spent; removed %s", layout.study_id, path)
    except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError):
        pass  # no file, or one the daemon already ignores: nothing to spend


# --------------------------------------------------------------------------- the store


def store_url(artifacts_root: Path) -> str:
    return f"sqlite:///{artifacts_root.resolve() / STORE_FILE}"


def job_defaults() -> dict[str, Any]:
    return {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}


def _offline_scheduler(**options: Any) -> Any:
    """A scheduler with no main loop: it edits and reads the job store but never runs or advances a
    job. (A paused BackgroundScheduler is not safe for this: its thread processes due jobs while it
    shuts down, which moves a missed run's time forward without running it.)"""
    from apscheduler.schedulers.base import BaseScheduler

    class OfflineScheduler(BaseScheduler):
        def wakeup(self) -> None:
            pass  # nothing to wake: this scheduler never processes jobs

        def shutdown(self, wait: bool = True) -> None:
            super().shutdown(wait)

    return OfflineScheduler(**options)


@contextmanager
def open_store(artifacts_root: Path) -> Iterator[Any]:
    """A non-running scheduler on the job store: read and edit jobs without running any."""
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    artifacts_root.mkdir(parents=True, exist_ok=True)
    scheduler = _offline_scheduler(jobstores={"default": SQLAlchemyJobStore(url=store_url(artifacts_root))},
                                   job_defaults=job_defaults())
    scheduler.start(paused=True)
    try:
        yield scheduler
    finally:
        scheduler.shutdown(wait=False)


def add_job(scheduler: Any, study_id: str, spec: ScheduleSpec, studies_root: Path, artifacts_root: Path,
            replace: bool = True) -> Any:
    """Add (or with ``replace``, reset) the study's job; returns the job, or None for a one-shot
    whose time has passed (it fired already, or the daemon's store still holds it: never twice)."""
    existing = scheduler.get_job(job_id(study_id))
    if existing is not None and not replace and existing.name == spec.key:
        return existing  # keep its stored next run time (a missed run must still happen)
    once = spec.once
    if once is not None and once <= dt.datetime.now().astimezone():
        return None
    kwargs: dict[str, Any] = {"study_id": study_id, "studies_dir": str(studies_root.resolve()),
                              "artifacts_dir": str(artifacts_root.resolve()), "window_s": spec.window_s}
    if once is not None:
        kwargs["once"] = spec.key
    return scheduler.add_job(JOB_FUNC, trigger=spec.trigger(), id=job_id(study_id), name=spec.key, kwargs=kwargs,
                             replace_existing=True, **job_defaults())


def schedule(study_id: str, spec: ScheduleSpec, studies_root: Path, artifacts_root: Path) -> dt.datetime | None:
    """Write the schedule file and (re)set the job; returns the next wake-up time. A one-shot time
    that has passed is a ``ValueError`` and nothing is written."""
    spec.check_future()
    layout = StudyLayout(study_id, studies_root, artifacts_root)
    write_schedule(layout, spec)
    with open_store(artifacts_root) as scheduler:
        job = add_job(scheduler, study_id, spec, studies_root, artifacts_root, replace=True)
        return job.next_run_time if job is not None else None


def unschedule(study_id: str, studies_root: Path, artifacts_root: Path) -> bool:
    """Remove the schedule file and the job; False when neither existed."""
    layout = StudyLayout(study_id, studies_root, artifacts_root)
    had_file = schedule_path(layout).is_file()
    schedule_path(layout).unlink(missing_ok=True)
    with open_store(artifacts_root) as scheduler:
        had_job = scheduler.get_job(job_id(study_id)) is not None
        if had_job:
            scheduler.remove_job(job_id(study_id))
    return had_file or had_job


def next_wakeups(artifacts_root: Path) -> dict[str, dt.datetime | None]:
    """study id -> next scheduled session, from the job store (empty when there is no store)."""
    if not (artifacts_root / STORE_FILE).is_file():
        return {}
    with open_store(artifacts_root) as scheduler:
        return {job.id.split(":", 1)[1]: job.next_run_time for job in scheduler.get_jobs()
                if job.id.startswith("resume:")}


def read_history(artifacts_root: Path) -> list[dict[str, Any]]:
    path = artifacts_root / HISTORY_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
