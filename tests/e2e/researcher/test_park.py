"""Parking a training run at a window's end: checkpointed and stopped, then resumed from that
checkpoint (a real `swarm serve` + `swarm run` with the tiny model), not retrained from step 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import wait_for

from researcher.runs import detached
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.runs.record import RunRecord
from researcher.types.settings import ResearcherSettings

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "studies" / "examples" / "letters"


def _step(launcher: Launcher, record: RunRecord) -> int:
    with launcher.client_for(record) as client:
        return client.status().step


@pytest.mark.slow
def test_parked_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    launcher = Launcher(ResearcherSettings().swarm_command, model="tiny", threads=1)
    run_dir = tmp_path / "run"
    record = RunRecord(key="park/1/0", study_id="park", iteration=1, trial=0, experiment="letters", seed=0,
                       config={}, client=str(EXAMPLE / "client.py"), target_step=1000, episodes=100_000,
                       group_size=8)
    runs.save(run_dir, record)
    record = launcher.start_server(run_dir, record, EXAMPLE / "config.toml")
    try:
        launcher.wait_ready(run_dir, record)
        record = launcher.start_client(run_dir, record)
        wait_for(lambda: _step(launcher, record) >= 3, 120, what="step 3", interval=0.3, log=run_dir / "client.log")
        server_pid, server_started = record.server_pid, record.server_started
        client_pid, client_started = record.client_pid, record.client_started

        record = launcher.park(run_dir, record, "the session window ended")
        parked_step = max(_checkpoint_steps(run_dir))
        assert parked_step >= 3
        assert not detached.alive(server_pid, server_started) and not detached.alive(client_pid, client_started)
        assert runs.load(run_dir).status == "parked" and not record.ended

        record = launcher.unpark(run_dir, record, EXAMPLE / "config.toml")
        launcher.wait_ready(run_dir, record)
        assert record.status == "running" and record.resumes == 1 and record.launches == 1
        assert _step(launcher, record) == parked_step  # restored from the checkpoint, not from step 0
        with launcher.client_for(record) as client:  # a run's server trains no step past its target
            assert client.config().values["max_steps"] == 1000
    finally:
        launcher.stop(run_dir, record, "stopped", "test over")
    assert not detached.alive(record.server_pid, record.server_started)


def _checkpoint_steps(run_dir: Path) -> list[int]:
    steps = [int(json.loads(meta.read_text())["step"]) for meta in (run_dir / "server" / "checkpoints").glob("*/meta.json")]
    assert steps, f"no checkpoint under {run_dir / 'server'}"
    return steps
