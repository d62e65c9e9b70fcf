"""Restarting on a state dir: the latest checkpoint, the live config and the pending episodes come
back; updates after the checkpoint are rolled back and their episodes trained again exactly once;
the policy version keeps growing; a retried finish after the restart is still a no-op; memory keeps
no trained episode."""

from __future__ import annotations

from server_harness import RunningServer
from support import wait_for

from swarm.server.durability.store import EpisodeStore

MESSAGES = [{"role": "user", "content": "say a"}]


def _episode(server: RunningServer, task: str) -> dict:
    with server.client() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task})
    assert response.status_code == 200, response.text
    episode = response.json()
    with server.client(episode["api_key"]) as http:
        assert http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4}).status_code == 200
    return episode


def _finish(server: RunningServer, episode: dict, reward: float) -> dict:
    with server.client(episode["api_key"]) as http:
        response = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward})
    assert response.status_code == 200, response.text
    return response.json()


def _status(server: RunningServer) -> dict:
    with server.client() as http:
        return http.get("/api/v1/status").json()


def test_restart_resumes_checkpoint_config_and_pending_episodes(start_server, tmp_path) -> None:
    state = tmp_path / "state"
    server = start_server(state_dir=state, group_size=1, min_group_size=1, batch_groups=1, max_staleness=64)
    assert _status(server)["defaults"] == {"source": "built-in", "keys": {}, "resumed": False}
    with server.client() as http:
        assert http.patch("/api/v1/config", json={"values": {"lr": 0.002}}).json()["version"] == 1
    first = _episode(server, "a")
    _finish(server, first, 1.0)
    wait_for(lambda: _status(server)["step"] == 1)
    with server.client() as http:
        assert http.post("/api/v1/control/checkpoint").json()["detail"]["path"].endswith("step-1")
    second = _episode(server, "b")
    _finish(server, second, 0.5)
    wait_for(lambda: _status(server)["step"] == 2)
    version_before = _status(server)["policy_version"]
    with server.client() as http:  # batch_groups 3: this episode stays pending across the restart
        http.patch("/api/v1/config", json={"values": {"batch_groups": 3}})
    pending = _episode(server, "c")
    _finish(server, pending, 0.25)
    assert server.core.episodes.held(first["episode_id"]) is None  # trained: evicted from memory
    server.stop()  # no checkpoint on this path: step 2 is lost, as after a crash

    server = start_server(state_dir=state, group_size=1, min_group_size=1, batch_groups=1, max_staleness=64)
    status = _status(server)
    assert status["step"] == 1
    assert status["defaults"]["resumed"]  # the stored config stands, not the one these settings seed
    assert status["policy_version"] > version_before  # older weights, a new and higher version id
    assert status["groups_pending"] == 2  # the rolled-back episode and the pending one
    with server.client() as http:  # the surviving step's metrics outlive the process; the lost one does not
        assert [m["step"] for m in http.get("/api/v1/metrics").json()] == [1]
    with server.client() as http:
        config = http.get("/api/v1/config").json()
        assert config["version"] == 2 and config["values"]["lr"] == 0.002 and config["values"]["batch_groups"] == 3
    assert _finish(server, second, 0.5)["state"] == "finished"  # a retried finish is still a no-op
    with server.client(second["api_key"]) as http:
        assert http.post(f"/api/v1/episodes/{second['episode_id']}/finish", json={"reward": 0.9}).status_code == 409
    third = _episode(server, "d")
    _finish(server, third, 0.0)
    wait_for(lambda: _status(server)["step"] == 2)  # the two restored episodes and the new one train together
    with server.client() as http:  # cumulative counts continue step 1's row: the lost step counts once
        rows = {m["step"]: m["metrics"] for m in http.get("/api/v1/metrics").json()}
    assert rows[1]["train/episodes_total"] == 1 and rows[2]["train/episodes_total"] == 1 + 3
    assert rows[2]["train/samples_total"] == rows[1]["train/samples_total"] + rows[2]["train/episodes"] * \
        rows[2]["context/samples_per_episode"]
    server.stop()
    with EpisodeStore(state / "buffer.db") as store:
        trained = store.trained_counts()
        log = store.training_log()
    assert trained == {first["episode_id"]: 1, second["episode_id"]: 1, pending["episode_id"]: 1,
                       third["episode_id"]: 1}
    assert (2, second["episode_id"], True) in log  # the lost step stays in the audit, flagged
