"""Storage errors on real ``swarm serve`` processes: a disk that refuses checkpoints never ends
training or a stop, a truncated latest checkpoint is quarantined and the previous one resumed, and a
garbage ``buffer.db`` is one clear line, not a traceback."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest
from rel_harness import start_server
from support import ServeProcess, free_port, wait_for

from swarm.server.durability.store import EpisodeStore

CONFIG = {"group_size": 1, "min_group_size": 1, "batch_groups": 1, "max_tokens": 4, "checkpoint_every": 1,
          "max_staleness": 64}
MESSAGES = [{"role": "user", "content": "say a"}]
# RLIMIT_FSIZE for the server once checkpoints should fail: below the tiny model's model.safetensors
# (1.68 MB; optimizer.pt is 3.4 MB) and far above what SQLite and the log write in this test
# (buffer.db-wal ~0.1 MB per step, checked below).
FILE_LIMIT = 1_400_000


def _train_one(server: ServeProcess, task: str, reward: float) -> None:
    """Finish one single-member group and wait until the step it makes has committed."""
    step = server.status()["step"]
    with server.http() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": task}).raise_for_status().json()
    with server.http(episode["api_key"]) as http:
        http.post("/v1/chat/completions", json={"messages": MESSAGES}).raise_for_status()
        http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward}).raise_for_status()
    wait_for(lambda: server.status()["step"] == step + 1, 120, what=f"step {step + 1}", log=server.log_path)


def _events(server: ServeProcess) -> list[dict[str, Any]]:
    """Every event the server holds (its history replays, then the stream ends)."""
    with server.http() as http:
        response = http.get("/api/v1/events", params={"last_event_id": 0, "timeout_s": 0.5})
    return [json.loads(line[len("data:"):]) for line in response.text.splitlines() if line.startswith("data:")]


def test_failing_checkpoints_never_stop_training_and_a_corrupt_one_is_skipped(rel_model: Path, tmp_path: Path,
                                                                               servers: list[ServeProcess]) -> None:
    assert (rel_model / "model.safetensors").stat().st_size > FILE_LIMIT
    state = tmp_path / "state"
    checkpoints = state / "checkpoints"
    server = start_server(rel_model, state, port=free_port(), config=CONFIG)
    servers.append(server)
    for n in (1, 2):
        _train_one(server, f"ok{n}", float(n % 2))
    wait_for(lambda: (checkpoints / "step-2" / "meta.json").is_file(), 120, what="checkpoint step-2",
             log=server.log_path)

    # The disk starts refusing big files (ulimit -f on the live process; CPython ignores SIGXFSZ, so
    # writes fail with EFBIG): each periodic checkpoint fails, every step still trains and commits.
    assert (state / "buffer.db-wal").stat().st_size < FILE_LIMIT / 3
    resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (FILE_LIMIT, resource.RLIM_INFINITY))
    for n in (3, 4, 5):
        _train_one(server, f"full{n}", float(n % 2))
    status = server.status()
    assert status["step"] == 5 and status["state"] in ("running", "training")
    assert status["last_error"]["where"] == "checkpoint" and status["last_error"]["message"]
    with server.http() as http:  # an explicit checkpoint is a clear error; the server runs on
        refused = http.post("/api/v1/control/checkpoint")
    assert refused.status_code == 500 and refused.json()["error"]["code"] == "internal"
    assert refused.json()["error"]["message"].startswith("the checkpoint failed: ")
    assert server.status()["state"] in ("running", "training")

    # stop: its checkpoint fails too; it answers, and the process exits non-zero well within 15 s.
    asked = time.monotonic()
    with server.http() as http:
        answer = http.post("/api/v1/control/stop").raise_for_status().json()
    assert answer["state"] == "stopping" and answer["detail"]["shutting_down"] is True
    assert answer["detail"]["checkpoint_error"] and "path" not in answer["detail"]
    assert server.process.wait(timeout=15 - (time.monotonic() - asked)) == 2
    assert "the server stopped without its final checkpoint" in server.log_path.read_text()
    with EpisodeStore(state / "buffer.db") as store:
        failures = [e.data["step"] for e in store.recent_events() if e.type == "error"]
        assert failures == [3, 4, 5, 5, 5]  # three periodic checkpoints, the explicit one, then stop's
        assert all(e.data["where"] == "checkpoint" for e in store.recent_events() if e.type == "error")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-2"]  # no half-written leftovers

    # The latest checkpoint loses half its weights file: the restart quarantines it, comes up at step 1
    # and retrains the rolled-back episodes (steps 2-5) from there.
    weights = checkpoints / "step-2" / "weights" / "model.safetensors"
    half = weights.stat().st_size // 2
    os.truncate(weights, half)
    server = start_server(rel_model, state, port=free_port(), config=CONFIG)
    servers.append(server)
    events = _events(server)
    quarantined = [e["data"] for e in events if e["type"] == "checkpoint.quarantined"]
    assert [q["step"] for q in quarantined] == [2] and quarantined[0]["path"] == str(checkpoints / ".bad-step-2")
    assert [e["data"]["step"] for e in events if e["type"] == "server.started"][-1] == 1
    assert (checkpoints / ".bad-step-2" / "weights" / "model.safetensors").stat().st_size == half  # kept as it was
    wait_for(lambda: server.status()["step"] == 5, 120, what="step 5 after the restart", log=server.log_path)
    server.kill()


def test_garbage_buffer_db_is_one_line_and_exit_2(rel_model: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    garbage = os.urandom(8192)
    (state / "buffer.db").write_bytes(garbage)
    server = ServeProcess(port=free_port(), state_dir=state, model=str(rel_model), given_token="rel-token",
                          log_path=tmp_path / "serve.log", env={"COLUMNS": "80"})
    returncode = server.run_refused(timeout_s=120)
    lines = [line for line in server.log().splitlines() if line.strip()]
    assert returncode == 2, server.log()
    assert len(lines) == 1 and str(state / "buffer.db") in lines[0] and "Traceback" not in lines[0], lines
    assert (state / "buffer.db").read_bytes() == garbage  # nothing changed


def test_no_loadable_checkpoint_refuses_to_start(rel_model: Path, tmp_path: Path) -> None:
    """With checkpoints but none that loads, restore refuses (the trainer may hold part of a failed
    load) and names what it quarantined; a start after that begins from the base weights."""
    from swarm.backends import load_backend
    from swarm.config import ServerConfig
    from swarm.server.durability.checkpoints import CheckpointManager
    from swarm.server.durability.recovery import RecoveryError, restore

    config = ServerConfig()
    backend = load_backend(str(rel_model), config, seed=0)
    manager = CheckpointManager(tmp_path / "checkpoints")
    saved = manager.save(1, 1, lambda folder: backend.save(str(folder)), {})
    (saved / "weights" / "model.safetensors").write_bytes(b"\x00" * 64)
    with EpisodeStore(tmp_path / "buffer.db") as store:
        with pytest.raises(RecoveryError, match=r"\.bad-step-1"):
            restore(store, manager, backend, config)
        assert sorted(p.name for p in manager.root.iterdir()) == [".bad-step-1"]
        assert restore(store, manager, backend, config).step == 0  # the operator's second start: fresh
