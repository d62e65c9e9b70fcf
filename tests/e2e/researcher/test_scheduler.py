"""Scheduling: the job store's contract, and a real `researcher daemon` process that is SIGKILLed
and restarted (jobs intact, missed times run once, coalesced).

The study here does not exist (a "ghost"), so each scheduled session is a real `researcher resume`
subprocess that exits at once with a clear refusal: this test is about the scheduler, the
end-to-end study windows are in test_windows.py.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from pathlib import Path

import pytest
from support import wait_for

from researcher.operations import scheduler
from researcher.operations.scheduler import ScheduleSpec
from researcher.study.layout import StudyLayout


def test_schedule_writes_file_and_durable_job(tmp_path: Path) -> None:
    studies, artifacts = tmp_path / "studies", tmp_path / "artifacts"
    when = scheduler.schedule("nightly", ScheduleSpec(window_s=3600, at="22:00"), studies, artifacts)
    assert when is not None and (when.hour, when.minute) == (22, 0)
    assert (studies / "nightly" / "schedule.toml").is_file()
    with scheduler.open_store(artifacts) as store:  # a fresh scheduler reads the job back from SQLite
        job = store.get_job("resume:nightly")
        assert job.func_ref == scheduler.JOB_FUNC
        assert (job.coalesce, job.max_instances, job.misfire_grace_time) == (True, 1, None)
        assert job.kwargs["window_s"] == 3600 and job.kwargs["study_id"] == "nightly"
    assert scheduler.next_wakeups(artifacts) == {"nightly": when}
    assert scheduler.unschedule("nightly", studies, artifacts)
    assert scheduler.next_wakeups(artifacts) == {} and not (studies / "nightly" / "schedule.toml").exists()
    assert not scheduler.unschedule("nightly", studies, artifacts)


def test_reading_the_store_never_advances_an_overdue_job(tmp_path: Path) -> None:
    studies, artifacts = tmp_path / "studies", tmp_path / "artifacts"
    at = dt.datetime.now().astimezone() + dt.timedelta(seconds=1)
    when = scheduler.schedule("due", ScheduleSpec(window_s=60, at=at.strftime("%H:%M:%S"), every_s=3600), studies,
                              artifacts)
    time.sleep(2)  # now overdue: only a daemon may run it (and then move it on)
    for _ in range(2):
        assert scheduler.next_wakeups(artifacts) == {"due": when}


def test_schedule_cli_refuses_unknown_study_and_bad_cron(cli) -> None:
    bad = cli.run("schedule", "ghost", "--cron", "61 * * * *", *cli.dirs)
    assert bad.returncode == 2 and "invalid --cron" in bad.stdout
    missing = cli.run("schedule", "ghost", "--at", "22:00", *cli.dirs)
    assert missing.returncode == 2 and "no study 'ghost'" in missing.stdout
    assert not (cli.studies / "ghost").exists() and not (cli.artifacts / "scheduler.db").exists()


def _executions(artifacts: Path) -> list[dict]:
    return [row for row in scheduler.read_history(artifacts) if row["event"] == "executed"]


@pytest.mark.slow
def test_daemon_sigkill_restart_keeps_jobs_and_runs_missed_time_once(cli, tmp_path: Path) -> None:
    studies, artifacts = cli.studies, cli.artifacts
    start = dt.datetime.now().astimezone() + dt.timedelta(seconds=4)
    scheduler.schedule("ghost", ScheduleSpec(window_s=30, at=start.strftime("%H:%M:%S"), every_s=3), studies,
                       artifacts)
    log1 = tmp_path / "daemon1.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log1)
    try:
        wait_for(lambda: len(_executions(artifacts)) >= 1, 40, what="the first scheduled session",
                 proc=daemon, log=log1, interval=0.2)
    finally:
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
    first = _executions(artifacts)
    assert first[0]["outcome"] == "refused" and first[0]["exit_code"] == 2  # `researcher resume ghost`: no study

    time.sleep(8)  # at least two scheduled times pass while no daemon runs
    overdue = scheduler.next_wakeups(artifacts)["ghost"]
    assert overdue is not None and overdue < dt.datetime.now().astimezone()  # the job survived, overdue
    # Every time from ``overdue`` to ``last_missed`` (the latest before the relaunch) is missed. Relaunching
    # just after a scheduled time gives the new daemon most of a period to start before the next one.
    period = dt.timedelta(seconds=3)
    last_missed = overdue + period * -(-(dt.datetime.now().astimezone() - overdue) // period)  # the next time from now
    time.sleep(max(0.0, (last_missed - dt.datetime.now().astimezone()).total_seconds() + 0.2))

    log2 = tmp_path / "daemon2.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log2)
    try:
        # The catch-up and a regular tick after it: missed times run once each (not coalesced) would all
        # have run before that tick.
        wait_for(lambda: len(_executions(artifacts)) >= len(first) + 2, 40,
                 what="the catch-up and a regular tick after it", proc=daemon, log=log2, interval=0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log2.read_text()[-2000:]
    after = [dt.datetime.fromisoformat(row["scheduled_for"]) for row in _executions(artifacts)[len(first):]]
    # Several times were missed while the daemon was dead: they ran once, coalesced into the latest of them
    # (``last_missed``, or a later one if the daemon took over a period to start), not once each.
    assert overdue < last_missed - period, (overdue, last_missed)
    assert after[0] >= last_missed and after == sorted(set(after)), (last_missed, after)
    assert not [r for r in scheduler.read_history(artifacts) if r["event"] == "missed"]
    assert "ghost" in scheduler.next_wakeups(artifacts)  # still scheduled after a clean shutdown


def test_at_a_date_time_schedules_one_resume_at_that_time(cli) -> None:
    studies, artifacts = cli.studies, cli.artifacts
    assert ScheduleSpec(window_s=60, at="2026-12-01T02:00").once == dt.datetime(2026, 12, 1, 2, 0).astimezone()
    now = dt.datetime.now().astimezone()
    at = (now + dt.timedelta(days=3)).strftime("%Y-%m-%dT02:00")
    expected = dt.datetime.fromisoformat(at).astimezone()  # naive means local time
    spec = ScheduleSpec(window_s=3600, at=at)
    assert scheduler.schedule("once", spec, studies, artifacts) == expected
    assert ScheduleSpec.from_toml((studies / "once" / "schedule.toml").read_text()) == spec
    with scheduler.open_store(artifacts) as store:  # a fresh scheduler reads the one-shot job back
        job = store.get_job("resume:once")
        assert type(job.trigger).__name__ == "DateTrigger" and job.next_run_time == expected
        assert job.kwargs["once"] == spec.key
    assert scheduler.next_wakeups(artifacts) == {"once": expected}

    # A past date-time is refused before anything is written; so is a date without a time.
    past = (now - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    with pytest.raises(ValueError, match="in the past"):
        scheduler.schedule("late", ScheduleSpec(window_s=60, at=past), studies, artifacts)
    with pytest.raises(ValueError, match="no time of day"):
        ScheduleSpec(window_s=60, at="2026-12-01")
    with pytest.raises(ValueError, match="ISO date-time"):
        ScheduleSpec(window_s=60, at="tomorrow")
    assert not (studies / "late").exists()
    refused = cli.run("schedule", "late", "--at", past, *cli.dirs)
    assert refused.returncode == 2 and "in the past" in refused.stdout, refused.stdout
    assert not (studies / "late").exists() and scheduler.next_wakeups(artifacts) == {"once": expected}

    # A spent one-shot left in a schedule file (it fired; the daemon's store dropped it) is never re-added.
    from researcher.operations.daemon import sync_jobs
    from researcher.study.layout import StudyLayout

    scheduler.write_schedule(StudyLayout("spent", studies, artifacts), ScheduleSpec(window_s=60, at=past))
    with scheduler.open_store(artifacts) as store:
        assert sync_jobs(store, studies, artifacts) == {"added": [], "removed": []}  # nor reported as added
    assert scheduler.next_wakeups(artifacts) == {"once": expected}


@pytest.mark.slow
def test_daemon_runs_a_one_shot_once_and_spends_it(cli, tmp_path: Path) -> None:
    studies, artifacts = cli.studies, cli.artifacts
    # Due in 2 s: if the daemon starts later, the one-shot is overdue and runs at once (still once).
    at = (dt.datetime.now() + dt.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S")
    scheduler.schedule("ghost", ScheduleSpec(window_s=30, at=at), studies, artifacts)
    log = tmp_path / "daemon.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log)
    try:
        wait_for(lambda: len(_executions(artifacts)) >= 1, 40, what="the one-shot session",
                 proc=daemon, log=log, interval=0.2)
        assert not (studies / "ghost" / "schedule.toml").exists()  # spent before the session even ran
        # No later sync may bring the one-shot back. The proof that one ran: a schedule file written
        # now (for a study due in an hour) is what the next sync adds; that sync adds nothing else, and
        # no second session has started (a session's start is logged at once).
        later = (dt.datetime.now() + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
        scheduler.write_schedule(StudyLayout("marker", studies, artifacts), ScheduleSpec(window_s=30, at=later))
        wait_for(lambda: "schedule sync: added ['marker']" in log.read_text(), 20,
                 what="a sync after the one-shot was spent", proc=daemon, log=log, interval=0.2)
        assert "added ['ghost']" not in log.read_text() and "'ghost', 'marker'" not in log.read_text()
        sessions = (artifacts / "ghost" / "sessions.log").read_text()
        assert sessions.count("=== scheduled session") == 1, sessions
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log.read_text()[-2000:]
    ran = _executions(artifacts)
    assert len(ran) == 1 and ran[0]["scheduled_for"] == dt.datetime.fromisoformat(at).astimezone().isoformat()
    assert ran[0]["outcome"] == "refused"  # `researcher resume ghost`: no such study, a clear refusal
    assert set(scheduler.next_wakeups(artifacts)) == {"marker"}  # the one-shot is gone


@pytest.mark.slow
def test_the_daemon_outlives_a_full_disk_under_its_job_store(cli, tmp_path: Path) -> None:
    """Issue #52: the job store sits on a small tmpfs that fills while a job fires every 2 s. APScheduler
    stores the next run time from inside its main loop; the daemon must log the refused write and go on,
    and fire again once there is room."""
    from support.disks import fill, small_disk

    with small_disk(tmp_path / "disk", 16) as disk:
        cli.artifacts = disk / "artifacts"
        scheduler.schedule("ghost", ScheduleSpec(window_s=30, every_s=2), cli.studies, cli.artifacts)
        log = tmp_path / "daemon.log"
        daemon = cli.popen("daemon", "--poll", "1", "--port", "0", *cli.dirs, log=log)
        try:
            wait_for(lambda: len(_executions(cli.artifacts)) >= 1, 60, what="a first session", proc=daemon, log=log)
            filler = fill(disk)
            wait_for(lambda: "the disk is full: could not store the next run time of job resume:ghost"
                     in log.read_text(), 60, what="a refused job-store write", proc=daemon, log=log)
            time.sleep(3)
            assert daemon.poll() is None, log.read_text()[-3000:]
            filler.unlink()
            before = len(_executions(cli.artifacts))
            wait_for(lambda: len(_executions(cli.artifacts)) > before, 60, what="a session once there is room",
                     proc=daemon, log=log)
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=30) == 0, log.read_text()[-2000:]
