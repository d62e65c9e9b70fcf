"""The server core's behaviour through the real server: grouping, drops, leases, idempotency, staleness,
category mixing, sync drains, and the training step that the batch triggers."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_harness import RunningServer
from support import wait_for

MESSAGES = [{"role": "user", "content": "say a"}]


def _claim(http: httpx.Client, task: str, **extra) -> httpx.Response:
    return http.post("/api/v1/episodes", json={"task_id": task, **extra})


def _episode(server: RunningServer, task: str, **extra) -> dict:
    with server.client() as http:
        response = _claim(http, task, **extra)
    assert response.status_code == 200, response.text
    return response.json()


def _chat(server: RunningServer, episode: dict, max_tokens: int = 6) -> dict:
    with server.client(episode["api_key"]) as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response.json()


def _finish(server: RunningServer, episode: dict, reward: float, metrics: dict[str, float] | None = None) -> None:
    with server.client(episode["api_key"]) as http:
        response = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish",
                             json={"reward": reward, "metrics": metrics or {}})
    assert response.status_code == 200, response.text


def _status(server: RunningServer) -> dict:
    with server.client() as http:
        return http.get("/api/v1/status").json()


def _events(server: RunningServer) -> list[dict]:
    """Every event so far, oldest first: the replay of ``GET /api/v1/events`` (the stream then ends).

    A negative check reads them instead of sleeping: the server answers this request on the event loop
    that its step loop runs on, after whatever an earlier request (a finish) woke there, so anything
    that earlier request set off has already said so here."""
    with server.client() as http:
        response = http.get("/api/v1/events", params={"last_event_id": 0, "timeout_s": 0.2})
    return [json.loads(line[len("data:"):]) for line in response.text.splitlines() if line.startswith("data:")]


def _metrics(server: RunningServer, since: int = 0) -> list[dict]:
    with server.client() as http:
        return http.get("/api/v1/metrics", params={"since_step": since}).json()


def test_complete_group_trains_and_reports_metrics(start_server) -> None:
    server = start_server(group_size=2, min_group_size=2, batch_groups=1)
    a, b = _episode(server, "t1"), _episode(server, "t1")
    assert a["group_id"] == b["group_id"] == "t1"
    c = _episode(server, "t2")  # another group, left unfinished
    for ep in (a, b, c):
        _chat(server, ep)
    _finish(server, a, 0.0, {"turns": 2.0})
    assert _status(server)["step"] == 0  # half a group trains nothing
    _finish(server, b, 1.0, {"turns": 4.0, "solved": 1.0})
    wait_for(lambda: _status(server)["step"] == 1)
    status = _status(server)
    assert status["policy_version"] == 1 and status["episodes"]["trained"] == 2
    assert status["episodes"]["claimed"] == 3 and status["episodes"]["finished"] == 2
    [step] = _metrics(server)
    m = step["metrics"]
    assert step["step"] == 1 and step["policy_version"] == 1
    assert m["train/reward_mean"] == 0.5 and m["train/reward_max"] == 1.0 and m["train/reward_std"] == 0.5
    assert m["train/episodes"] == 2 and m["train/groups"] == 1
    assert m["episode/turns"] == 3.0 and m["episode/solved"] == 1.0  # clients' own metrics, averaged
    assert m["context/samples_per_episode"] == 1.0 and m["context/merge"] == 1.0
    assert m["context/tokens_trained"] > 0 and m["context/drift_forks"] == 0
    assert "train/loss" in m and m["perf/step_s"] > 0 and m["perf/episodes_per_s"] > 0
    # The server corrects for stale samples by default; these were sampled by the current policy.
    assert m["train/rollout_is_weight_mean"] == pytest.approx(1.0, abs=0.01) and m["train/rollout_is_truncated"] == 0
    assert _metrics(server, since=1) == []
    # A chat call after the update is served by the new policy.
    assert _chat(server, c)["policy_version"] == 1


def test_small_group_is_dropped_and_failed_members_skipped(start_server) -> None:
    server = start_server(group_size=3, min_group_size=2, batch_groups=1)
    eps = [_episode(server, "g") for _ in range(3)]
    for ep in eps:
        _chat(server, ep)
    _finish(server, eps[0], 1.0)
    with server.client() as http:
        for ep in eps[1:]:
            assert http.post(f"/api/v1/episodes/{ep['episode_id']}/abort", json={"reason": "tool crashed"}).status_code == 200
    status = _status(server)
    assert status["episodes"]["aborted"] == 2 and status["episodes"]["dropped"] == 1 and status["step"] == 0
    # Next group: one aborted member is skipped, the two finished ones train.
    eps = [_episode(server, "g") for _ in range(3)]
    assert eps[0]["group_id"] == "g"
    for ep, reward in zip(eps[:2], (0.0, 1.0)):
        _chat(server, ep)
        _finish(server, ep, reward)
    with server.client() as http:
        http.post(f"/api/v1/episodes/{eps[2]['episode_id']}/abort", json={})
    wait_for(lambda: _status(server)["step"] == 1)
    assert _metrics(server)[0]["metrics"]["train/episodes"] == 2


def test_varied_groups_mode_skips_identical_rewards(start_server) -> None:
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, batch_mode="varied_groups")
    same = [_episode(server, "same") for _ in range(2)]
    for ep in same:
        _chat(server, ep)
        _finish(server, ep, 1.0)
    assert _status(server)["episodes"]["dropped"] == 2 and _status(server)["step"] == 0
    varied = [_episode(server, "varied") for _ in range(2)]
    for ep, reward in zip(varied, (0.0, 1.0)):
        _chat(server, ep)
        _finish(server, ep, reward)
    wait_for(lambda: _status(server)["step"] == 1)


def test_idempotent_claim(start_server) -> None:
    server = start_server(group_size=2, min_group_size=1)
    with server.client() as http:
        first = _claim(http, "t", request_id="req-1").json()
        again = _claim(http, "t", request_id="req-1").json()
        other = _claim(http, "t", request_id="req-2").json()
    assert first == again and other["episode_id"] != first["episode_id"]
    assert _status(server)["episodes"]["claimed"] == 2


def test_lease_expiry_discards_and_late_finish_is_gone(start_server) -> None:
    server = start_server(group_size=1, min_group_size=1, batch_groups=1)
    short = _episode(server, "t", lease_s=0.3)
    kept = _episode(server, "t", lease_s=3.0)  # heartbeats keep it alive even on a loaded machine
    _chat(server, short)
    for _ in range(6):  # heartbeats keep one episode alive past its lease
        with server.client(kept["api_key"]) as http:
            assert http.post(f"/api/v1/episodes/{kept['episode_id']}/heartbeat").status_code == 200
        time.sleep(0.1)
    wait_for(lambda: _status(server)["episodes"]["expired"] == 1, timeout=5)
    assert server.core.lifecycle.get(short["episode_id"]).trace.tokens == 0  # partial trace discarded
    with server.client(short["api_key"]) as http:
        late = http.post(f"/api/v1/episodes/{short['episode_id']}/finish", json={"reward": 1.0})
        chat = http.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert late.status_code == 410 and "expired" in late.json()["error"]["message"]
    assert chat.status_code == 410
    with server.client() as http:
        assert http.get(f"/api/v1/episodes/{kept['episode_id']}").json()["state"] == "claimed"


def test_async_staleness_drops_old_samples(start_server) -> None:
    server = start_server(group_size=1, min_group_size=1, batch_groups=1, mode="async", max_staleness=0)
    old = _episode(server, "old")
    _chat(server, old)  # generated by version 0
    with server.client() as http:  # a second group could only train after old's: admission refuses it
        refused = _claim(http, "fresh")
        assert refused.status_code == 429 and refused.headers["retry-after"], refused.text
        assert refused.json()["error"]["detail"]["reason"] == "backlog at max_staleness + 1 batches"
        assert http.patch("/api/v1/config", json={"values": {"admission": False}}).status_code == 200
    status = _status(server)
    assert status["episodes"]["refused_stale"] == 1 and status["recent"]["refused_stale"] == 1
    assert status["refusal_reasons"] == {"backlog at max_staleness + 1 batches": 1}
    fresh = _episode(server, "fresh")  # without admission it starts, and trains first
    _chat(server, fresh)
    _finish(server, fresh, 1.0)
    wait_for(lambda: _status(server)["policy_version"] == 1)
    _finish(server, old, 1.0)  # its only sample is one version behind: dropped, no step
    wait_for(lambda: _status(server)["episodes"]["dropped"] == 1)
    status = _status(server)
    assert status["step"] == 1 and status["episodes"]["trained"] == 1
    assert status["episodes"]["dropped_stale"] == 1 and status["recent"]["dropped_stale"] == 1
    assert status["drop_reasons"] == {"older than max_staleness=0": 1}
    # With max_staleness=1 the same situation trains.
    with server.client() as http:
        assert http.patch("/api/v1/config", json={"values": {"max_staleness": 1}}).status_code == 200
    old = _episode(server, "old2")
    _chat(server, old)
    fresh = _episode(server, "fresh2")
    _chat(server, fresh)
    _finish(server, fresh, 1.0)
    wait_for(lambda: _status(server)["step"] == 2)
    _finish(server, old, 0.0)
    wait_for(lambda: _status(server)["step"] == 3)


def test_category_throttle_follows_ratios(start_server) -> None:
    server = start_server(group_size=1, min_group_size=1, batch_groups=100, category_ratios={"math": 2, "code": 1})
    started = {"math": 0, "code": 0}
    refused = 0
    with server.client() as http:
        for i in range(30):  # a client that always prefers math, falling back to code on 429
            response = _claim(http, f"m{i}", category="math")
            if response.status_code == 429:
                refused += 1
                assert response.json()["error"]["retry_after"] > 0 and response.headers["retry-after"]
                response = _claim(http, f"c{i}", category="code")
            assert response.status_code == 200, response.text
            started[response.json()["category"]] += 1
        # An unlisted category and the members of a started group are never throttled.
        assert _claim(http, "x", category="other").status_code == 200
    assert refused == started["code"] == 10 and started["math"] == 20


def test_sync_mode_drains_before_update(start_server) -> None:
    server = start_server(group_size=1, min_group_size=1, batch_groups=1, mode="sync")
    a, b = _episode(server, "a"), _episode(server, "b")
    _chat(server, a)
    _chat(server, b)
    _finish(server, a, 1.0)  # batch ready, but b is still in flight
    with server.client() as http:
        refused = _claim(http, "c")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "retry_later"
    assert refused.json()["error"]["retry_after"] > 0
    _finish(server, b, 0.0)  # drained: the update runs, then claims resume
    wait_for(lambda: _status(server)["step"] >= 1, what="the step after the drain")
    wait_for(lambda: _status(server)["state"] == "running", what="claims to resume after the step")
    with server.client() as http:
        assert _claim(http, "c").status_code == 200
    # No update while b was in flight: in the server's own event order, the first step started after
    # b's finish (an ordering, where a sleep could only show that no step had *finished* yet).
    order = [(e["type"], e["data"].get("episode_id")) for e in _events(server)]
    first_step = [kind for kind, _ in order].index("step.started")
    assert order.index(("episode.finished", b["episode_id"])) < first_step, order


def test_pause_resume_and_checkpoint(start_server) -> None:
    server = start_server(group_size=1, min_group_size=1, batch_groups=1)
    ep = _episode(server, "t")
    _chat(server, ep)
    with server.client() as http:
        assert http.post("/api/v1/control/pause").json()["state"] == "paused"
        assert _claim(http, "t2").status_code == 429
        _finish(server, ep, 1.0)  # a ready batch: it wakes the step loop, which must not step while paused
        # Read after the finish's wake-up had its turn (see _events): no step started, the batch still waits.
        assert "step.started" not in [e["type"] for e in _events(server)]  # no steps while paused
        status = _status(server)
        assert status["step"] == 0 and status["groups_pending"] == 1 and status["state"] == "paused"
        assert http.post("/api/v1/control/resume").json()["state"] == "running"
        wait_for(lambda: _status(server)["step"] == 1, what="the held-back step after resume")
        result = http.post("/api/v1/control/checkpoint").json()
    assert result["detail"]["path"].endswith("step-1")
    assert (server.state_dir / "checkpoints" / "step-1").is_dir()


def test_live_config_patch(start_server) -> None:
    server = start_server(group_size=4, min_group_size=2, batch_groups=4)
    with server.client() as http:
        view = http.patch("/api/v1/config", json={"values": {"batch_groups": 1, "group_size": 1,
                                                              "min_group_size": 1, "lr": 0.01,
                                                              "checkpoint_every": 1}}).json()
        assert view["version"] == 1 and view["values"]["lr"] == 0.01
        assert http.get("/api/v1/config").json() == view
        ep = _claim(http, "t").json()
    _chat(server, ep)
    _finish(server, ep, 1.0)  # the patched batch size applies immediately
    wait_for(lambda: _status(server)["step"] == 1)
    assert _status(server)["config_version"] == 1
    wait_for(lambda: (server.state_dir / "checkpoints" / "step-1" / "meta.json").exists())


def test_sft_warm_up_lowers_the_loss(start_server) -> None:
    server = start_server()
    examples = [{"messages": [{"role": "user", "content": f"reverse {n}"}], "completion": str(n)[::-1]}
                for n in (123, 456, 789, 2024)]
    with server.client() as http:
        result = http.post("/api/v1/control/sft", json={"examples": examples, "steps": 6, "batch_size": 4,
                                                        "lr": 0.01}).json()
    assert result["steps"] == 6 and result["policy_version"] == 6
    assert result["loss_last"] < result["loss_first"]



@pytest.mark.parametrize(("old_module", "old_name", "new_module", "new_name"), [
    ("swarm.local.engines", "load_engines", "swarm.local.roles", "load_roles"),
])
def test_renamed_import_paths_still_work_with_a_deprecation_warning(old_module: str, old_name: str, new_module: str,
                                                                    new_name: str) -> None:
    """The names "engine" lost to ``--engine``'s meaning keep working for one release, with a warning."""
    import importlib
    import sys

    sys.modules.pop(old_module, None)
    with pytest.warns(DeprecationWarning, match=f"{new_module}.{new_name}"):
        old = importlib.import_module(old_module)
    assert getattr(old, old_name) is getattr(importlib.import_module(new_module), new_name)
