"""Acceptance: a real `researcher daemon` resumes a scheduled study in windows, the study parks at
each window's end (runs checkpointed and stopped) and the next scheduled time picks it up; a manual
resume during a daemon session is refused by the lock; a SIGKILLed daemon's missed time still runs;
a last resume without a window finishes the study. Its review is then read back through a real
`mlflow server`'s REST API.

The windows end before the runs do whatever the machine's speed: the study's task is the letters
example with every episode lasting at least ``EPISODE_S`` (an agent waiting on a slow tool). A run's
client keeps at most one training batch of episodes in flight, so a run trains at most one step per
``EPISODE_S`` of client time, and ``STEPS`` steps need more client time than the start window and the
two scheduled windows give together. Every run is therefore parked at each window's end and finishes
in the final resume; a faster machine only shortens the rest of each step.

Real everything: the daemon, `researcher resume` sessions, `swarm serve` + `swarm run` with the
tiny model, the APScheduler SQLite job store, LangGraph's SQLite checkpointer, MLflow.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support import free_port, wait_for

from researcher.operations import scheduler
from researcher.runs import record as runs

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"
SID = "nightly"
LETTERS = Path(__file__).resolve().parents[3] / "studies" / "examples" / "letters"
EPISODE_S = 3.0  # every episode lasts at least this long: a run trains at most one step per EPISODE_S
STEPS = 40  # the MLflow check below wants at least 40 logged steps per run
START_WINDOW_S, WINDOW_S = 10, 35  # `start --window`, then each scheduled session's window
EVERY_S = 75  # longer than a session (window + start-up + parking), so windows never overlap
PACED_CLIENT = '''"""The letters example, every episode lasting at least {pace} s (an agent waiting on a slow tool)."""

import time

from swarm.client import load_study, run_study_cli

letters = load_study({example!r})
GROUP_SIZE, CONCURRENCY, tasks, heldout = letters.GROUP_SIZE, letters.CONCURRENCY, letters.tasks, letters.heldout
REWARD_RANGE = (0.0, 1.0)
EVAL_EVERY = 0  # no held-out rounds: the windows' pacing counts training steps only


def workflow(ep, task):
    time.sleep({pace})
    return letters.workflow(ep, task)


if __name__ == "__main__":
    run_study_cli(__file__)
'''


@pytest.fixture
def paced_cli(cli, tmp_path: Path):
    """`cli` run from a folder whose ``studies/examples/letters`` is the paced letters example."""
    checkout = tmp_path / "checkout"
    example = checkout / "studies" / "examples" / "letters"
    example.mkdir(parents=True)
    for name in ("README.md", "config.toml"):
        shutil.copyfile(LETTERS / name, example / name)
    (example / "client.py").write_text(PACED_CLIENT.format(pace=EPISODE_S, example=str(LETTERS / "client.py")))
    cli.cwd = checkout
    return cli


def _log_count(cli, text: str) -> int:
    path = cli.studies / SID / "LOG.md"
    return path.read_text().count(text) if path.is_file() else 0


def _status(cli) -> dict:
    done = cli.run("status", SID, "--json", *cli.dirs)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.study  # about 160 s: the scheduler's daemon, missed times and restarts stay in test_scheduler
@pytest.mark.timeout(1200)
def test_daemon_windows_park_and_resume_then_review_in_mlflow(paced_cli, tmp_path: Path, no_leftover_servers) -> None:
    cli = paced_cli
    # The construction (module docstring): a run needs 120 s of client time, the three windows give at
    # most 80 s (less their servers' start-ups); the rest covers a few steps at each window's edges.
    assert STEPS * EPISODE_S > 1.4 * (START_WINDOW_S + 2 * WINDOW_S)
    runs_dir = cli.artifacts / SID / "runs"
    first = cli.run("start", "--topic", TOPIC, "--study-id", SID, "--budget", "20m", "--window", f"{START_WINDOW_S}s",
                    "--steps-per-run", str(STEPS), "--seeds", "1", "--parallel", "2", "--max-iterations", "1",
                    *cli.dirs)
    assert first.returncode == 0 and "parked" in first.stdout, first.stdout + first.stderr
    assert _status(cli)["state"] == "parked"

    at = dt.datetime.now().astimezone() + dt.timedelta(seconds=8)
    scheduled = cli.run("schedule", SID, "--at", at.strftime("%H:%M:%S"), "--every", f"{EVERY_S}s",
                        "--window", f"{WINDOW_S}s", *cli.dirs)
    assert scheduled.returncode == 0, scheduled.stdout + scheduled.stderr
    assert _status(cli)["next_wakeup"] == at.replace(microsecond=0).isoformat()

    log1 = tmp_path / "daemon1.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log1)
    try:
        # Window 1: the daemon resumes the study; while it runs, a manual resume is refused by the lock.
        wait_for(lambda: _log_count(cli, "Resumed (phase parked") >= 1 and _status(cli)["active"], 60,
                 what="the daemon's first session", proc=daemon, log=log1, interval=0.3)
        manual = cli.run("resume", SID, *cli.dirs)
        assert manual.returncode == 2 and "already being run by another researcher process" in manual.stdout
    finally:
        # The daemon dies mid-session: the session (its own process group) runs on to its window end,
        # and the next scheduled time passes while no daemon runs.
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
    wait_for(lambda: _log_count(cli, "Parked in phase") >= 2 and not _status(cli)["active"], 120,
             what="the first window to end", interval=0.3)
    window1 = runs.all_records(runs_dir)
    assert all(r.launches == 1 and r.status == "parked" for r in window1), window1
    assert _status(cli)["state"] == "parked"
    no_leftover_servers(runs_dir)  # parked = checkpointed and stopped, nothing left running

    second_time = at + dt.timedelta(seconds=EVERY_S)
    time.sleep(max(0.0, (second_time - dt.datetime.now().astimezone()).total_seconds()) + 2)
    assert _status(cli)["next_wakeup"] == second_time.replace(microsecond=0).isoformat()  # overdue, intact
    log2 = tmp_path / "daemon2.log"
    daemon = cli.popen("daemon", "--poll", "1", *cli.dirs, log=log2)
    try:
        wait_for(lambda: _log_count(cli, "Resumed (phase parked") >= 2, 60, what="the missed second session",
                 proc=daemon, log=log2, interval=0.3)
        wait_for(lambda: _log_count(cli, "Parked in phase") >= 3 and not _status(cli)["active"], 120,
                 what="the second window to end", proc=daemon, log=log2, interval=0.3)
        # The session has parked and let go of its lock a moment before it exits and the daemon writes
        # its execution down: a stop signal in between cut that record (seen on a busy machine).
        wait_for(lambda: any(r["event"] == "executed" for r in scheduler.read_history(cli.artifacts)), 60,
                 what="the daemon to record the second session", proc=daemon, log=log2, interval=0.3)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    history = scheduler.read_history(cli.artifacts)
    ran = [r for r in history if r["event"] == "executed" and r["outcome"] == "ran"]
    # Window 1's execution was never recorded (its daemon was SIGKILLed mid-session); window 2 ran once.
    assert [dt.datetime.fromisoformat(r["scheduled_for"]) for r in ran] == [second_time.replace(microsecond=0)]
    assert not [r for r in history if r["event"] == "missed"]
    window2 = runs.all_records(runs_dir)
    assert len(window2) == 2 and all(r.launches == 1 and r.status == "parked" for r in window2), window2
    assert _status(cli)["state"] == "parked"
    no_leftover_servers(runs_dir)

    # Let it finish (no window), then the review exists on disk and in MLflow.
    final = cli.run("resume", SID, *cli.dirs, timeout=600)
    assert final.returncode == 0, final.stdout + final.stderr
    records = runs.all_records(runs_dir)
    assert {r.status for r in records} == {"finished"} and all(r.launches == 1 for r in records)
    # Parked in a window, resumed from its checkpoint in the next session (not relaunched from scratch).
    assert all(r.resumes >= 1 for r in records), [(r.key, r.resumes) for r in records]
    assert "resumed from its checkpoint" in (cli.studies / SID / "LOG.md").read_text()
    assert all(r.last_step >= STEPS for r in records)
    # The runs trained with the paced client the construction relies on.
    paced = (cli.cwd / "studies" / "examples" / "letters" / "client.py").read_text()
    assert {Path(r.client).read_text() for r in records} == {paced}
    no_leftover_servers(runs_dir)
    study_dir = cli.studies / SID
    review_md = (study_dir / "review.md").read_text()
    assert review_md.count("| 1 | h1:") == 2 and "keep" in review_md and "discard" in review_md
    assert (study_dir / "figures" / "review.png").stat().st_size > 5000
    report = cli.run("report", SID, *cli.dirs)
    assert report.returncode == 0 and "## Answer" in report.stdout and "| verdict |" in report.stdout

    _check_mlflow_rest(cli, tmp_path, records)


def _check_mlflow_rest(cli, tmp_path: Path, records: list[runs.RunRecord]) -> None:
    port = free_port()
    store = f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}"
    log = open(tmp_path / "mlflow.log", "wb")  # noqa: SIM115 - the server writes it for its life
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

        wait_for(ready, 120, what="mlflow server", proc=server, log=tmp_path / "mlflow.log", interval=0.3)
        experiment = httpx.get(f"{api}/experiments/get-by-name", params={"experiment_name": SID}).json()["experiment"]
        found = httpx.post(f"{api}/runs/search", json={"experiment_ids": [experiment["experiment_id"]],
                                                       "max_results": 100}).json()["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in found]
        parents = [r for r, t in zip(found, tags, strict=True) if t.get("researcher.kind") == "iteration"]
        assert len(parents) == 1
        listed = httpx.get(f"{api}/artifacts/list", params={"run_id": parents[0]["info"]["run_id"],
                                                            "path": "review"}).json()
        figures = httpx.get(f"{api}/artifacts/list", params={"run_id": parents[0]["info"]["run_id"],
                                                             "path": "review/figures"}).json()
        names = {f["path"] for f in listed["files"] + figures.get("files", [])}
        assert {"review/review.md", "review/review.csv", "review/figures/review.png"} <= names  # where review.md points
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
