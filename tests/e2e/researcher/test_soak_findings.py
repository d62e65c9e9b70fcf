"""Regression tests for what the soak (tests/soak, issue #39) found, one each:

1. a local run whose server was SIGKILLed ended ``crashed``: nothing brought it back;
2. a run whose server stopped while MLflow was away never had its last steps in MLflow (the server
   keeps them for a next start that never comes once the run ended); the first fix sent a held-out
   round's step without its training metrics (its later eval-only line replaced the step's line);
3. a study that ended while MLflow was away left its writes in the spool, where nothing delivered them;
4. a researcher SIGKILLed during a smoke run left the smoke run's server running for good;
5. a client restarted after a SIGKILL gave up on admission refusals before its predecessor's leases ran
   out: a live server's "retry later" now restarts the client's retry window
   (tests/integration/swarm_client/test_client_transport.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from support import free_port, wait_for

from researcher.runs import detached, smoke
from researcher.runs import launcher as launching
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.runs.record import RunRecord
from researcher.session import runner
from researcher.session.nodes import monitor
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from swarm import tracking
from swarm.protocol import StepMetrics

# Stands in for `swarm` on the command line: `... serve --state-dir …` runs this, which sleeps.
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _record(run_dir: Path) -> RunRecord:
    (run_dir / "exp").mkdir(parents=True)
    (run_dir / "exp" / "config.toml").write_text("lr = 1e-3\n")
    return RunRecord(key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=0, config={},
                     client=str(run_dir / "exp" / "client.py"), target_step=8, episodes=64, group_size=8,
                     status="running", last_step=3, launches=1, state_dir=str(run_dir / "server"))


def test_a_sigkilled_local_server_is_restarted_from_its_state_dir_not_ended_as_a_crash(tmp_path: Path) -> None:
    launcher, record = Launcher(SLEEPER), _record(tmp_path)
    record = launcher.start_server(tmp_path, record.model_copy(update={"launches": 0, "status": "pending"}),
                                   tmp_path / "exp" / "config.toml")
    first = (record.server_pid, record.server_started, record.port)
    try:
        launcher.stop_client(record)
        detached.stop_group(record.server_pid, record.server_started, grace_s=0.1)  # SIGKILLed, as by the OOM killer
        assert not launcher.server_alive(record)

        assert launcher.revive(tmp_path, record)
        saved = runs.load(tmp_path)
        assert saved is not None and saved.status == "running" and saved.launches == 1  # not a second launch
        assert (saved.revives, saved.resumes, saved.revived_at_step) == (1, 1, 3)
        assert saved.server_pid != first[0] and launcher.server_alive(saved)
        assert launcher.awaiting_client(saved)  # the monitor starts the client once the server answers
        argv = Path(f"/proc/{saved.server_pid}/cmdline").read_bytes().split(b"\0")
        assert str(record.state_dir).encode() in argv  # the same state dir: it resumes from its checkpoint
    finally:
        detached.stop_group(record.server_pid, record.server_started, grace_s=0.1)

    # Bounded: after MAX_REVIVES restarts without a step trained since the last, it is a crash.
    record.revives, record.revived_at_step = launching.MAX_REVIVES, record.last_step
    assert not launcher.revive(tmp_path, record)
    record.last_step += 1  # it trained on since: another restart is earned
    try:
        assert launcher.revive(tmp_path, record)
    finally:
        detached.stop_group(record.server_pid, record.server_started, grace_s=0.1)


def test_closing_a_run_sends_the_steps_its_server_left_undelivered(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlruns")
    run_id = tracker.start_child("s", None, "run", {}, {})
    run_dir = tmp_path / "run"
    record = _record(run_dir).model_copy(update={"mlflow_run_id": run_id, "server_logs_mlflow": True,
                                                 "last_step": 4, "status": "finished"})
    runs.append_metrics(run_dir, [StepMetrics(step=s, policy_version=s, time=1000.0 + s, metrics={"train/reward_mean": s / 10})
                                  for s in range(1, 5)])
    # Step 4's held-out round, logged after the step (the monitor's late eval row): it adds, never replaces.
    runs.append_metrics(run_dir, [StepMetrics(step=4, policy_version=4, time=1004.0, metrics={"eval/reward_mean": 0.5})])
    state_dir = Path(record.state_dir)
    state_dir.mkdir()
    # The server delivered steps 1-2 itself, then was stopped while the store was away.
    tracker.log_steps(run_id, runs.read_steps(run_dir)[:2])
    (state_dir / tracking.SERVER_CURSOR_FILE).write_text(json.dumps(
        {"tracking_uri": tracker.uri, "experiment": "s", "run_id": run_id, "params_logged": True, "delivered_step": 2}))

    ctx = SimpleNamespace(tracker=tracker, launcher=Launcher(["swarm"]), layout=StudyLayout("s", tmp_path, tmp_path),
                          say=lambda *a, **k: None)
    monitor._close(ctx, run_dir, record)
    history = tracker.client.get_metric_history(run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # each once: step 1-2 were not sent again
    assert [m.step for m in tracker.client.get_metric_history(run_id, "eval/reward_mean")] == [4]


def test_a_study_that_ends_while_mlflow_is_away_delivers_its_spool_when_it_answers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    layout = StudyLayout("s", tmp_path / "studies", tmp_path / "artifacts")
    spool = layout.artifacts_dir / "mlflow_spool"
    away = Tracker(f"http://127.0.0.1:{free_port()}", tmp_path / "mlruns", spool)
    local_id = away.start_parent("s", 1, {})
    assert local_id is None or local_id.startswith("local-") or away.spool.pending()
    assert away.spool.pending()

    started = time.monotonic()
    assert not runner.deliver_spool(SimpleNamespace(tracker=away, layout=layout), wait_s=0.0)
    assert time.monotonic() - started < 30
    assert "`researcher resume s` delivers them" in layout.log_md.read_text()

    back = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlruns", spool)  # the store answers again
    assert runner.deliver_spool(SimpleNamespace(tracker=back, layout=layout), wait_s=0.0)
    assert not back.spool.pending()
    experiment = back.client.get_experiment_by_name("s")
    assert experiment is not None and len(back.client.search_runs([experiment.experiment_id])) == 1



def test_a_smoke_server_left_by_a_killed_researcher_is_stopped_by_the_next_session(tmp_path: Path) -> None:
    work, config = tmp_path / "smoke" / "01-01", tmp_path / "config.toml"
    config.write_text("lr = 1e-3\n")
    # A researcher in its smoke run, waiting for the server to answer (this one never does) ...
    code = ("from pathlib import Path\nfrom researcher.runs.launcher import Launcher\nfrom researcher.runs import smoke\n"
            f"smoke.run(Launcher({SLEEPER!r}), Path('client.py'), Path({str(config)!r}), Path({str(work)!r}), "
            "episodes=2, group_size=2, timeout_s=60)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    researcher = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        record = wait_for(lambda: runs.load(work), 60, what="the smoke run's record", proc=researcher)
    finally:
        researcher.kill()  # ... is SIGKILLed: its `finally` never stops the server
        researcher.wait()
    try:
        assert detached.alive(record.server_pid, record.server_started)
        assert smoke.stop_leftovers(tmp_path / "smoke") == 1  # what `researcher resume` does first
        assert not detached.alive(record.server_pid, record.server_started)
        assert smoke.stop_leftovers(tmp_path / "smoke") == 0
    finally:
        detached.stop_group(record.server_pid, record.server_started, grace_s=0.1)



def test_a_create_whose_answer_was_lost_is_not_made_twice_by_its_retry(tmp_path: Path) -> None:
    """The store took a create_run and was killed before answering: the write is spooled and replayed,
    and the replay finds the run the lost answer named instead of creating a second (the 60-minute soaks'
    duplicate_runs=1 each: a KILLED empty twin beside the run that trained)."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "mlruns", tmp_path / "spool")
    real_create = tracker.client.create_run

    def create_then_lose_the_answer(*args, **kwargs):
        real_create(*args, **kwargs)
        raise ConnectionResetError("the store went away before it answered")

    tracker.client.create_run = create_then_lose_the_answer
    local_id = tracker.start_child("s", None, "run", {"lr": 0.1}, {"researcher.run_key": "s/1/0"})
    assert local_id.startswith("local-") and tracker.spool.pending()

    tracker.client.create_run = real_create  # the store answers again
    assert tracker.flush(force=True)
    experiment = tracker.client.get_experiment_by_name("s")
    created = tracker.client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in created] == [tracker.real_id(local_id)]  # one run, and the local id names it
    assert created[0].data.params == {"lr": "0.1"}


def test_a_step_committed_between_the_status_and_the_metrics_read_counts_as_reached(tmp_path: Path) -> None:
    """The monitor reads the server's status, then its metrics; a step committed between the two was
    logged (metrics.jsonl, MLflow) but run.json's last_step stayed one behind, and a run that crashed
    right after kept it so (the seed-3 soak's mlflow_gaps=1: MLflow held step 7, run.json said 6).
    A client that answers the two reads as the server did then stands in for it."""
    run_dir = tmp_path / "run"
    record = _record(run_dir).model_copy(update={"last_step": 5, "logged_step": 5})

    def row(step: int) -> StepMetrics:
        return StepMetrics(step=step, policy_version=step, time=1000.0 + step, metrics={"train/reward_mean": 0.1})

    class CommittedBetweenReads:
        def __enter__(self) -> CommittedBetweenReads:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def status(self) -> SimpleNamespace:
            return SimpleNamespace(step=6)  # read first

        def metrics(self, since_step: int) -> list[StepMetrics]:
            return [row(s) for s in (5, 6, 7) if s >= since_step]  # read after step 7 committed

    ctx = SimpleNamespace(launcher=SimpleNamespace(client_for=lambda record, timeout: CommittedBetweenReads()),
                          say=lambda *a, **k: None)
    poll = monitor.Poll(ctx, {"framing": {"metric": "train/reward_mean"}}, run_dir, record, now=2000.0,
                        server_alive=True)
    monitor._fetch(poll)
    assert [m.step for m in runs.read_steps(run_dir)] == [6, 7]
    assert record.logged_step == 7 and record.last_step == 7
