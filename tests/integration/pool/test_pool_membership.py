"""Pool membership on a real server (the app on loopback, the tiny model): only the worker token
opens the worker routes and it opens nothing else; a joined worker is ``syncing`` until it reports
the version the server named (a full snapshot of it is served under the snapshot prefix), then
``ready``; leaving drains it; a missed lease drops it and its next heartbeat is told to join again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swarm_server"))
from server_harness import RunningServer, launch

JOIN = {"engine": "torch", "address": "http://127.0.0.1:9", "capacity": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    import torch

    from swarm.models.tiny import build_tiny

    torch.set_num_threads(1)
    model = build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    running = launch(model, tmp_path_factory.mktemp("state"), worker_lease_s=1.0)
    yield running
    running.stop()


def _worker_token(server: RunningServer) -> str:
    path = server.state_dir / "worker_token"
    assert path.stat().st_mode & 0o777 == 0o600
    return path.read_text().strip()


def test_only_the_worker_token_opens_the_worker_routes_and_nothing_else(server: RunningServer) -> None:
    worker = _worker_token(server)
    client = (server.state_dir / "client_token").read_text().strip()
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "t"}).json()
    for token, status in (("wrong", 401), (client, 403), (episode["api_key"], 403)):
        with server.client(token) as http:
            assert http.post("/api/v1/workers", json=JOIN).status_code == status, token
            assert http.get("/pool/v1/versions").status_code == status
    with server.client() as http:
        assert http.get("/api/v1/status").json()["workers"] == [{**_local(http)}]
    with server.client(worker) as http:
        assert http.get("/api/v1/status").status_code == 403
        assert http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
                         ).status_code == 403
        assert http.post("/api/v1/episodes", json={"task_id": "t"}).status_code == 403
        assert http.patch("/api/v1/config", json={"values": {"lr": 0.1}}).status_code == 403
        assert http.post("/api/v1/workers", json={**JOIN, "capacity": 0}).status_code == 422  # never a 500


def _local(http) -> dict:
    (local,) = [w for w in http.get("/api/v1/status").json()["workers"] if w["id"] == "local"]
    assert local["state"] == "ready" and local["engine"] == "torch"
    return local


def test_a_worker_syncs_before_it_is_ready_then_drains_and_is_dropped(server: RunningServer) -> None:
    from swarm.pool.wire import Joined
    from swarm.weights.shards import decode

    with server.client(_worker_token(server)) as http:
        joined = Joined.model_validate(http.post("/api/v1/workers", json=JOIN).json())
        assert joined.version == 0 and joined.lease_s == 1.0
        manifest = http.get(f"{joined.snapshot_source}/pool/v1/versions/0/manifest").json()
        assert manifest["base_version"] is None  # a full snapshot: what a joiner loads
        chunks = [http.get(f"{joined.snapshot_source}/pool/v1/versions/0/chunks/{c['index']}").content
                  for c in manifest["chunks"]]
        from swarm.weights.shards import Manifest

        weights = decode(Manifest.model_validate(manifest), chunks)
        trained = server.core.trainer.export_weights()
        assert set(weights) == set(trained) and all((weights[k] == trained[k]).all() for k in weights)
        beat = f"/api/v1/workers/{joined.worker_id}/heartbeat"
        syncing = http.post(beat, json={"version": None}).json()
        assert syncing["state"] == "syncing" and syncing["snapshot_version"] == 0
        assert http.post(beat, json={"version": 0, "in_flight": 0}).json()["state"] == "ready"
        member = _member(server, joined.worker_id)
        assert member["state"] == "ready" and member["version"] == 0 and member["address"] == JOIN["address"]
        returncode, out, err = _status_while_beating(server, http, beat)
        assert returncode == 0, err  # `swarm status` lists the pool, one line per member
        assert f"worker {joined.worker_id}" in out and "ready  torch  v0  0/4 in flight" in out, out
        assert http.delete(f"/api/v1/workers/{joined.worker_id}").json() == {"ok": True}
        assert _member(server, joined.worker_id)["state"] == "draining"
        # its lease (1 s) runs out: the sweeper drops it
        wait_for(lambda: _member(server, joined.worker_id)["state"] == "dropped", 20, interval=0.1)
        gone = http.post(beat, json={"version": 0})
        assert gone.status_code == 404 and "join again" in gone.json()["error"]["message"]


def _status_while_beating(server: RunningServer, http: httpx.Client, beat: str) -> tuple[int, str, str]:
    """``swarm status`` as a user runs it, while the worker keeps beating: starting a Python process
    takes seconds on a busy machine, longer than the 1 s lease that would otherwise drop the worker."""
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "status", server.url, "--token", server.token],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + 120
    while True:
        assert http.post(beat, json={"version": 0, "in_flight": 0}).json()["state"] == "ready"
        try:
            out, err = proc.communicate(timeout=0.3)
            return proc.returncode, out, err
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                proc.kill()
                raise


def _member(server: RunningServer, worker_id: str) -> dict:
    with server.client() as http:
        return next(w for w in http.get("/api/v1/status").json()["workers"] if w["id"] == worker_id)


def test_a_worker_behind_is_named_the_peers_that_hold_the_newest_version(server: RunningServer) -> None:
    from swarm.pool.wire import BeatReply, Joined

    with server.client(_worker_token(server)) as http:
        def join(address: str) -> str:
            return Joined.model_validate(http.post("/api/v1/workers", json={**JOIN, "address": address}).json()).worker_id

        def beat(worker_id: str, version: int | None) -> BeatReply:
            return BeatReply.model_validate(http.post(f"/api/v1/workers/{worker_id}/heartbeat",
                                                      json={"version": version}).json())

        holder, behind = join("http://127.0.0.1:11"), join("http://127.0.0.1:12")
        try:
            assert beat(holder, None).peers == []  # nobody holds version 0 yet
            assert beat(holder, 0).peers == []  # up to date: no catching up to do
            reply = beat(behind, None)
            assert reply.version == 0 and reply.peers == ["http://127.0.0.1:11"]
            assert beat(behind, 0).peers == []
        finally:
            for worker_id in (holder, behind):
                http.delete(f"/api/v1/workers/{worker_id}")
