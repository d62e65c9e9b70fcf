"""A full disk under a real server's state dir is a state it reports, not a crash (issue #52).

A real server (tiny model, loopback) keeps its state dir on a small tmpfs. After two trained steps and a
checkpoint, three episodes are claimed; one finishes while the server is paused, and the disk is then
filled to the last byte. From there: the paused step cannot reserve its policy version and waits
(``last_error``, no crash); a finish answers 507 ``disk_full`` (never 500) and stays unacknowledged;
claims answer 507; the status and ``swarm status`` say "disk full" with the free space; a checkpoint
answers 507 and leaves the previous one whole and loadable, with no partial files. The swarm client
keeps retrying its finishes. Once the filler is deleted, with no restart, every finish the client was
told about is in the buffer, each episode trains exactly once and training goes on step by step.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import httpx
from server_harness import RunningServer
from support import wait_for
from support.disks import fill, small_disk
from typer.testing import CliRunner

from swarm.client import EpisodeHandle, SwarmClient
from swarm.server.durability.checkpoints import CheckpointManager

MESSAGES = [{"role": "user", "content": "say a"}]
CONFIG = {"group_size": 1, "min_group_size": 1, "batch_groups": 1, "max_tokens": 4, "max_staleness": 64,
          "mode": "async", "lease_s": 6.0}


def _chat(url: str, handle: EpisodeHandle) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {handle.api_key}"}, timeout=60) as http:
        http.post("/v1/chat/completions", json={"messages": MESSAGES}).raise_for_status()


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_full_disk_refuses_with_507_keeps_every_episode_and_training_resumes(start_server, tmp_path) -> None:
    with small_disk(tmp_path / "disk", 48) as disk:
        state = disk / "state"
        server = start_server(state_dir=state, disk_reserve_mb=1, **CONFIG)
        control = server.client()
        client = SwarmClient(server.url, token=server.token, retry_for_s=60)
        handles: list[EpisodeHandle] = []
        try:
            _exercise(server, control, client, handles, state, disk)
        finally:
            for handle in handles:  # stops their heartbeats before the client closes
                handle.close()
            client.close()
            control.close()
            server.stop()


def _exercise(server: RunningServer, control: httpx.Client, client: SwarmClient, handles: list[EpisodeHandle],
              state: Path, disk: Path) -> None:
    acknowledged: list[str] = []
    for n in (1, 2):  # two trained steps and a checkpoint of step 2, before the disk fills
        with client.episode(task_id=f"warm{n}") as handle:
            _chat(server.url, handle)
            handle.finish(reward=float(n % 2))
            acknowledged.append(handle.episode_id)
        wait_for(lambda n=n: server.core.step == n, 60, what=f"step {n}")
    assert control.post("/api/v1/control/checkpoint").json()["detail"]["path"].endswith("step-2")
    checkpoint = state / "checkpoints" / "step-2"
    whole = _digests(checkpoint)

    handles += [client.claim(task_id=task) for task in ("a", "b", "parked")]
    first, second, parked = handles
    for handle in (first, second, parked):
        _chat(server.url, handle)
    control.post("/api/v1/control/pause").raise_for_status()
    parked.finish(reward=1.0)  # committed; its step waits for the resume
    acknowledged.append(parked.episode_id)

    filler = fill(disk)
    control.post("/api/v1/control/resume").raise_for_status()
    wait_for(lambda: (server.status().get("last_error") or {}).get("where") == "train_step", 20,
             what="the step to meet the full disk")
    status = server.status()
    assert status["step"] == 2 and "full" in status["last_error"]["message"], status["last_error"]

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {first.api_key}"}) as http:
        refused = http.post(f"/api/v1/episodes/{first.episode_id}/finish", json={"reward": 0.0})
    assert refused.status_code == 507, refused.text
    error = refused.json()["error"]
    assert error["code"] == "disk_full" and "is still open" in error["message"] and error["retry_after"] > 0
    assert client.episode_status(first.episode_id).state.value == "claimed"  # not acknowledged, not lost

    claim = control.post("/api/v1/episodes", json={"task_id": "c"})
    assert claim.status_code == 507 and claim.json()["error"]["code"] == "disk_full", claim.text

    disk_status = server.status()["disk"]
    assert disk_status["full"] and disk_status["free_bytes"] < 2**20 and disk_status["reserve_bytes"] == 2**20
    from swarm.cli import app

    shown = CliRunner().invoke(app, ["status", server.url, "--token", server.token], env={"COLUMNS": "300"})
    assert shown.exit_code == 0 and "disk full" in shown.output and "MiB free" in shown.output, shown.output

    failed = control.post("/api/v1/control/checkpoint")
    assert failed.status_code == 507 and failed.json()["error"]["code"] == "disk_full", failed.text
    assert sorted(p.name for p in (state / "checkpoints").iterdir()) == ["step-2"]  # no partial directory
    assert _digests(checkpoint) == whole
    latest = CheckpointManager.load_meta(checkpoint)
    assert latest.step == 2

    # The client keeps both finishes (retrying each 507) while the disk stays full.
    threads = [threading.Thread(target=h.finish, kwargs={"reward": r}, daemon=True)
               for h, r in ((first, 0.0), (second, 1.0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=8.0)  # longer than the 6 s lease: the refused finishes renew it
    assert all(thread.is_alive() for thread in threads)
    assert server.core.step == 2

    filler.unlink()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert first.state == second.state == "finished"
    acknowledged += [first.episode_id, second.episode_id]
    wait_for(lambda: server.core.step == 5, 60, what="the parked step and the two retried ones")

    store = server.core.store
    assert all(store.known(episode_id) for episode_id in acknowledged)  # stored, or pruned by retention
    assert store.trained_counts() == dict.fromkeys(acknowledged, 1)
    with client.episode(task_id="after") as handle:  # claims work again, and training goes on
        _chat(server.url, handle)
        handle.finish(reward=1.0)
    wait_for(lambda: server.core.step == 6, 60, what="a step after the disk had room again")
    assert not server.status()["disk"]["full"]
    assert control.post("/api/v1/control/checkpoint").json()["detail"]["path"].endswith("step-6")
    from swarm.backends.torch import TorchBackend

    TorchBackend.from_model(str(checkpoint / "weights"), seed=0)  # the previous checkpoint still loads
