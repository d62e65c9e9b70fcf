"""Acceptance: a real `researcher daemon` resumes a scheduled study in windows, the study parks at
each window's end (runs checkpointed and stopped) and the next scheduled time picks it up; a manual
resume during a daemon session is refused by the lock; a SIGKILLed daemon's missed time still runs.
The finished study's review is then read back through a real `mlflow server`'s REST API.

Real everything: the daemon, `researcher resume` sessions, `swarm serve` + `swarm run` with the
tiny model, the APScheduler SQLite job store, LangGraph's SQLite checkpointer, MLflow.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from researcher import runs, scheduler

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"
SID = "nightly"


def _wait(predicate, timeout: float, what: str, daemon: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if daemon is not None:
            assert daemon.poll() is None, f"daemon exited while waiting for {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {log.read_text()[-3000:] if log else ''}"
        time.sleep(0.3)


def _log_count(cli, text: str) -> int:
    path = cli.studies / SID / "LOG.md"
    return path.read_text().count(text) if path.is_file() else 0


def _status(cli) -> dict:
    done = cli.run("status", SID, "--json", *cli.dirs)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_daemon_windows_park_and_resume_then_review_in_mlflow(cli, tmp_path: Path, no_leftover_servers) -> None:
    runs_dir = cli.artifacts / SID / "runs"
    first = cli.run("start", "--topic", TOPIC, "--study-id", SID, "--budget", "20m", "--window", "10s",
                    "--steps-per-run", "40", "--seeds", "1", "--parallel", "2", "--max-iterations", "1", *cli.dirs)
    assert first.returncode == 0 and "parked" in first.stdout, first.stdout + first.stderr
    assert _status(cli)["state"] == "parked"

    at = dt.datetime.now().astimezone() + dt.timedelta(seconds=8)
    every = 75  # longer than a session (35 s window + start-up + parking), so windows never overlap
    scheduled = cli.run("schedule", SID, "--at", at.strftime("%H:%M:%S"), "--every", f"{every}s", "--window", "35s",
                        *cli.dirs)
    assert scheduled.returncode == 0, scheduled.stdout + scheduled.stderr
    assert _status(cli)["next_wakeup"] == at.replace(microsecond=0).isoformat()

    log1 = tmp_path / "daemon1.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log1)
    try:
        # Window 1: the daemon resumes the study; while it runs, a manual resume is refused by the lock.
        _wait(lambda: _log_count(cli, "Resumed (phase parked") >= 1 and _status(cli)["active"], 60,
              "the daemon's first session", daemon, log1)
        manual = cli.run("resume", SID, *cli.dirs)
        assert manual.returncode == 2 and "already being run by another researcher process" in manual.stdout
    finally:
        # The daemon dies mid-session: the session (its own process group) runs on to its window end,
        # and the next scheduled time passes while no daemon runs.
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
    _wait(lambda: _log_count(cli, "Parked in phase") >= 2 and not _status(cli)["active"], 120,
          "the first window to end")
    window1 = runs.all_records(runs_dir)
    assert all(r.launches == 1 and r.status in ("parked", "finished") for r in window1), window1
    assert _status(cli)["state"] == "parked"
    no_leftover_servers(runs_dir)  # parked = checkpointed and stopped, nothing left running

    second_time = at + dt.timedelta(seconds=every)
    time.sleep(max(0.0, (second_time - dt.datetime.now().astimezone()).total_seconds()) + 2)
    assert _status(cli)["next_wakeup"] == second_time.replace(microsecond=0).isoformat()  # overdue, intact
    log2 = tmp_path / "daemon2.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log2)
    try:
        _wait(lambda: _log_count(cli, "Resumed (phase parked") >= 2, 60, "the missed second session", daemon, log2)
        _wait(lambda: not _status(cli)["active"] and (_log_count(cli, "Parked in phase") >= 3
                                                      or _status(cli)["state"] == "done"), 120,
              "the second window to end", daemon, log2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    history = scheduler.read_history(cli.artifacts)
    ran = [r for r in history if r["event"] == "executed" and r["outcome"] == "ran"]
    # Window 1's execution was never recorded (its daemon was SIGKILLed mid-session); window 2 ran once.
    assert [dt.datetime.fromisoformat(r["scheduled_for"]) for r in ran] == [second_time.replace(microsecond=0)]
    assert not [r for r in history if r["event"] == "missed"]
    window2 = runs.all_records(runs_dir)
    assert len(window2) == 2 and all(r.launches == 1 for r in window2)
    no_leftover_servers(runs_dir)

    # Let it finish (no window), then the review exists on disk and in MLflow.
    if _status(cli)["state"] != "done":
        final = cli.run("resume", SID, *cli.dirs, timeout=400)
        assert final.returncode == 0, final.stdout + final.stderr
    records = runs.all_records(runs_dir)
    assert {r.status for r in records} == {"finished"} and all(r.launches == 1 for r in records)
    # Parked in a window, resumed from its checkpoint in the next session (not relaunched from scratch).
    assert any(r.resumes >= 1 for r in records), [(r.key, r.resumes) for r in records]
    assert "resumed from its checkpoint" in (cli.studies / SID / "LOG.md").read_text()
    assert all(r.last_step >= 40 for r in records)
    no_leftover_servers(runs_dir)
    study_dir = cli.studies / SID
    review_md = (study_dir / "review.md").read_text()
    assert review_md.count("| 1 | h1:") == 2 and "keep" in review_md and "discard" in review_md
    assert (study_dir / "figures" / "review.png").stat().st_size > 5000
    report = cli.run("report", SID, *cli.dirs)
    assert report.returncode == 0 and "## Answer" in report.stdout and "| verdict |" in report.stdout

    _check_mlflow_rest(cli, tmp_path, records)


def _check_mlflow_rest(cli, tmp_path: Path, records: list[runs.RunRecord]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}"
    log = open(tmp_path / "mlflow.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
                               "--default-artifact-root", (cli.artifacts.resolve() / "mlartifacts").as_uri(),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              env=cli.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, 120, "mlflow server", server, tmp_path / "mlflow.log")
        experiment = httpx.get(f"{api}/experiments/get-by-name", params={"experiment_name": SID}).json()["experiment"]
        found = httpx.post(f"{api}/runs/search", json={"experiment_ids": [experiment["experiment_id"]],
                                                       "max_results": 100}).json()["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in found]
        parents = [r for r, t in zip(found, tags, strict=True) if t.get("researcher.kind") == "iteration"]
        assert len(parents) == 1
        listed = httpx.get(f"{api}/artifacts/list", params={"run_id": parents[0]["info"]["run_id"],
                                                            "path": "review"}).json()
        names = {f["path"] for f in listed["files"]}
        assert {"review/review.md", "review/review.csv", "review/review.png"} <= names
        children = {t.get("researcher.run_key"): (r, t) for r, t in zip(found, tags, strict=True)
                    if t.get("researcher.kind") == "training-run"}
        for record in records:
            run, tag = children[record.key]
            assert tag["researcher.verdict"] in ("keep", "discard") and tag["researcher.hypothesis_id"] == "h1"
            assert tag["mlflow.parentRunId"] == parents[0]["info"]["run_id"]
            history = httpx.get(f"{api}/metrics/get-history", params={"run_id": run["info"]["run_id"],
                                                                     "metric_key": "train/reward_mean"}).json()
            assert len({m["step"] for m in history["metrics"]}) >= 40
        verdicts = sorted(children[r.key][1]["researcher.verdict"] for r in records)
        assert verdicts == ["discard", "keep"]
        # MLflow's search (what the UI's filter box runs) finds runs by lineage tags.
        kept = httpx.post(f"{api}/runs/search", json={"experiment_ids": [experiment["experiment_id"]],
                                                      "filter": "tags.`researcher.verdict` = 'keep'"}).json()["runs"]
        assert len(kept) == 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
