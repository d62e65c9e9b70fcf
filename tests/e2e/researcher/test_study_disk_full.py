"""A full disk parks a study with a ``disk_full`` event, and a resume once there is room runs on (issue #52).

The study folder and the artifacts (graph.db, events.jsonl, the MLflow store and spool) lie on a small
tmpfs, filled to the last byte mid-study. The session-level tests drive the real graph on the offline
planner through ``researcher.session.runner``, filling the disk at a chosen event (the context's ``emit`` is
the seam): right after a node ran, so LangGraph's own checkpoint write is refused, or as a node starts,
so the node's own write is. The end-to-end test (``-m study``) runs ``researcher start`` as a process
with real training runs, fills the disk while they train, then resumes to a report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from support import wait_for
from support.disks import fill, small_disk

from researcher.runs import record as runs
from researcher.session import runner
from researcher.session.composition import build_context, build_settings
from researcher.study import files as studyfiles
from researcher.study.events import EventLog, events_path, read_events
from researcher.study.layout import StudyLayout
from researcher.tracking.spool import Spool
from researcher.types.settings import StudyOptions
from swarm.atomic import write_atomic

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


def _fill_on(emit: Callable[[str, Mapping[str, object]], None], disk: Path, kind: str,
             **match: object) -> Callable[[str, Mapping[str, object]], None]:
    """``emit``, filling ``disk`` right after the first event of ``kind`` whose fields ``match``."""
    filled: list[Path] = []

    def wrapped(event: str, data: Mapping[str, object]) -> None:
        emit(event, data)
        if not filled and event == kind and all(data.get(k) == v for k, v in match.items()):
            filled.append(fill(disk))

    return wrapped


def _assert_whole(*folders: Path) -> None:
    """No half-written file: every .json parses, every .jsonl line and LOG.md ends whole."""
    for folder in folders:
        for path in folder.rglob("*.json"):
            json.loads(path.read_text())
        for path in folder.rglob("*.jsonl"):
            text = path.read_text()
            assert not text or text.endswith("\n"), path
            for line in text.splitlines():
                json.loads(line)
        for path in folder.rglob("LOG.md"):
            assert path.read_text().endswith("\n"), path


def _disk_full_seen(layout: StudyLayout, caplog: pytest.LogCaptureFixture, node: str | None) -> bool:
    """A ``disk_full`` event naming ``node`` in events.jsonl, or (the disk refused even that) the warning
    that carries it."""
    if any(e["kind"] == "disk_full" and e["node"] == node for e in read_events(events_path(layout))):
        return True
    return any("disk_full" in r.getMessage() and json.dumps({"node": node})[1:-1] in r.getMessage()
               for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("when", ["checkpoint", "node"])
def test_a_full_disk_parks_the_session_and_a_resume_runs_on(tmp_path: Path, when: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """``checkpoint``: the disk fills as frame_topic leaves, so LangGraph's checkpoint after it is
    refused (outside every node); ``node``: it fills as plan_experiments enters, whose plan.json is."""
    caplog.set_level(logging.WARNING)
    with small_disk(tmp_path / "disk", 48) as disk:
        settings = build_settings(disk / "studies", disk / "artifacts", env={})
        options = StudyOptions(min_free_disk_mb=0, steps_per_run=2, seeds=1, max_iterations=1)
        ctx = build_context(settings, f"full-{when}", options)
        layout = ctx.layout
        if when == "checkpoint":
            ctx.emit = _fill_on(ctx.emit, disk, "node", action="leave", node="frame_topic")
        else:
            ctx.emit = _fill_on(ctx.emit, disk, "node", action="enter", node="plan_experiments")

        state = runner.start(ctx, TOPIC, options, time.time() + 600)  # returns: no traceback

        assert (disk / "filler").is_file(), "the disk was never filled"
        assert state["phase"] == "parked", state.get("error")
        assert "disk full" in state["parked"]["reason"]
        assert state["parked"]["phase"] in ("framing", "planning")
        # The refused checkpoint is the session's (no node); the refused plan.json is plan_experiments'.
        assert _disk_full_seen(layout, caplog, None if when == "checkpoint" else "plan_experiments")
        _assert_whole(layout.study_dir, layout.artifacts_dir)
        assert not layout.plan_json.exists()  # the refused write left no half of it

        (disk / "filler").unlink()  # room again: the next session runs on from the last checkpoint
        resumed_ctx = build_context(settings, layout.study_id, options, window_s=0)  # parks at the next boundary
        resumed = runner.resume(resumed_ctx)
        assert resumed["phase"] == "parked" and "window ended" in resumed["parked"]["reason"]
        assert resumed["framing"]["knob"] == "group_size"  # framed (again, where its checkpoint was refused)
        _assert_whole(layout.study_dir, layout.artifacts_dir)
        log_md = layout.log_md.read_text()
        assert "Resumed (phase" in log_md and "Framed the topic" in log_md


def test_study_files_are_whole_or_unchanged_when_the_disk_refuses_a_write(tmp_path: Path) -> None:
    """LOG.md and events.jsonl get whole lines or nothing (a write cut short is truncated back), and
    plan.json is replaced whole or kept, its temporary file removed."""
    with small_disk(tmp_path / "disk", 1) as disk:
        layout = StudyLayout("whole", disk / "studies", disk / "artifacts")
        layout.ensure()
        log = EventLog(events_path(layout))
        studyfiles.log(layout, "first entry")
        log.append("note", text="first event")
        write_atomic(layout.plan_json, json.dumps({"iterations": {}}))
        before = {p: p.read_bytes() for p in (layout.log_md, events_path(layout), layout.plan_json)}
        fill(disk)
        big = "y" * 20000  # more than the slack left in each file's last page: a short write, then ENOSPC
        with pytest.raises(OSError):
            studyfiles.log(layout, big)
        with pytest.raises(OSError):
            log.append("note", text=big)
        with pytest.raises(OSError):
            write_atomic(layout.plan_json, json.dumps({"iterations": {"1": big}}))
        assert {p: p.read_bytes() for p in before} == before
        assert not [p.name for p in layout.study_dir.iterdir() if p.name.endswith(".tmp")]
        assert [e["id"] for e in read_events(events_path(layout))] == [1]


def test_the_spool_keeps_whole_records_on_a_full_disk_and_delivers_them_later(tmp_path: Path) -> None:
    """A spooled write the disk refuses is held in memory (nothing raised, no torn line), written before
    the next one once there is room, and replayed in order; a replay whose rewrite the disk refuses
    applies nothing twice."""
    with small_disk(tmp_path / "disk", 1) as disk:
        spool = Spool(disk / "mlflow_spool")
        spool.append("metrics", {"value": 0})
        spool.append("metrics", {"value": 1})
        filler = fill(disk)
        spool.append("metrics", {"value": 2, "pad": "x" * 8192})  # refused: held, not raised
        assert spool.held == 1 and spool.pending() == 3
        assert spool.ops_file.read_text().count("\n") == 2  # the two whole records, no torn third

        applied: list[int] = []
        away = [True]

        def store_fails_on_1(op: str, args: dict) -> None:
            if args["value"] == 1 and away:
                away.clear()
                raise ConnectionError("the store is away")
            applied.append(args["value"])

        with pytest.raises(ConnectionError):  # 0 applied; the file cannot be rewritten without it
            spool.replay(store_fails_on_1)
        assert spool.pending() == 2
        assert spool.replay(store_fails_on_1) == 2  # 0 is not applied twice
        assert applied == [0, 1, 2] and spool.pending() == 0 and spool.held == 0

        filler.unlink()
        spool.append("metrics", {"value": 3})
        assert spool.pending() == 1
        assert spool.replay(lambda op, args: applied.append(args["value"])) == 1 and applied[-1] == 3
        for line in spool.ops_file.read_text().splitlines():
            json.loads(line)


@pytest.mark.study
@pytest.mark.timeout(900)
def test_a_study_whose_disk_fills_mid_run_parks_then_resumes_to_a_report(cli, tmp_path: Path) -> None:
    """`researcher start` as a process, real runs on the tiny model; the disk fills while they train."""
    with small_disk(tmp_path / "disk", 1024) as disk:  # above the study's own 500 MB disk watchdog
        cli.studies, cli.artifacts = disk / "studies", disk / "artifacts"
        sid = "full-disk-e2e"
        proc = cli.popen("start", "--topic", TOPIC, "--budget", "10m", "--study-id", sid, "--steps-per-run", "3",
                         "--seeds", "1", "--max-iterations", "1", *cli.dirs, log=tmp_path / "start.log")
        runs_dir = cli.artifacts / sid / "runs"
        try:
            wait_for(lambda: any(r.last_step >= 1 for r in runs.all_records(runs_dir)), 300,
                     what="a run at step 1", proc=proc, interval=0.5)
            filler = fill(disk)
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        output = (tmp_path / "start.log").read_text()
        assert code == 0 and "Traceback" not in output, output[-4000:]
        assert "parked" in output and "disk full" in output, output[-4000:]
        layout = StudyLayout(sid, cli.studies.resolve(), cli.artifacts.resolve())
        events = read_events(events_path(layout))
        assert any(e["kind"] == "disk_full" for e in events) or "disk_full" in output, output[-4000:]
        _assert_whole(cli.studies, cli.artifacts)

        filler.unlink()
        resumed = cli.run("resume", sid, *cli.dirs, timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        report = (cli.studies / sid / "report.md").read_text()
        assert "## Answer" in report
        _assert_whole(cli.studies, cli.artifacts)
