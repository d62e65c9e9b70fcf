"""SwarmClient against a real tiny-model server: episode lifecycle, aborts, leases, errors, run()."""

from __future__ import annotations

import math
import threading
import time

import pytest
from support import ServeProcess, wait_for

from swarm.client import EpisodeHandle, SwarmClient, SwarmError, SwarmHTTPError, SwarmUnavailable
from swarm.protocol import EpisodeState, ServerState


def _ask(ep: EpisodeHandle, text: str = "hello") -> str:
    reply = ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": text}],
                                                max_tokens=4)
    return reply.choices[0].message.content or ""


def test_episode_finishes_with_reward_and_is_counted(client: SwarmClient) -> None:
    before = client.status().episodes.finished
    with client.episode("t-finish") as ep:
        assert ep.base_url.endswith("/v1") and ep.api_key and ep.task_id == "t-finish"
        _ask(ep)
        result = ep.finish(0.25, metrics={"turns": 1.0})
    assert result.state is EpisodeState.finished and result.reward == 0.25
    assert ep.state == "finished" and ep.reward == 0.25
    assert client.episode_status(ep.episode_id).state is EpisodeState.finished
    assert client.status().episodes.finished == before + 1


def test_exception_in_block_aborts_with_traceback_and_reraises(client: SwarmClient) -> None:
    with pytest.raises(ZeroDivisionError), client.episode("t-crash") as ep:
        _ask(ep)
        1 / 0  # noqa: B018
    assert ep.state == "aborted"
    assert client.episode_status(ep.episode_id).state is EpisodeState.aborted


def test_leaving_without_finish_aborts(client: SwarmClient) -> None:
    with client.episode("t-forgot") as ep:
        pass
    assert ep.state == "aborted"
    assert client.episode_status(ep.episode_id).state is EpisodeState.aborted


def test_nan_reward_is_refused_before_sending_and_episode_still_ends(client: SwarmClient) -> None:
    with pytest.raises(ValueError, match="finite"), client.episode("t-nan") as ep:
        ep.finish(math.nan)
    assert client.episode_status(ep.episode_id).state is EpisodeState.aborted


def test_heartbeats_keep_a_short_lease_alive(client: SwarmClient) -> None:
    with client.episode("t-lease", lease_s=1.0) as ep:
        first_expiry = client.episode_status(ep.episode_id).lease_expires_at
        assert first_expiry is not None
        control = client.claim("t-lease-control", lease_s=1.0)  # claimed later, with the same lease...
        control.close()  # ...and no heartbeats
        # The server has expired the control, whose lease ran out after ep's first one would have...
        wait_for(lambda: client.episode_status(control.episode_id).state is not EpisodeState.claimed, 20,
                 what="the server to expire an episode without heartbeats")
        # ...and ep has lived > 2 leases: only the background heartbeats keep it claimed.
        wait_for(lambda: (s := client.episode_status(ep.episode_id)).state is not EpisodeState.claimed
                 or (s.lease_expires_at or 0.0) >= first_expiry + 2.0, 20, what="two lease renewals by heartbeats")
        assert client.episode_status(control.episode_id).state is EpisodeState.expired
        assert client.episode_status(ep.episode_id).state is EpisodeState.claimed
        ep.finish(1.0)


def test_without_heartbeats_the_lease_expires_and_finish_is_refused(client: SwarmClient) -> None:
    ep = client.claim("t-expire", lease_s=1.0)
    ep.close()  # stops heartbeats, leaves the episode claimed
    wait_for(lambda: client.episode_status(ep.episode_id).state is not EpisodeState.claimed, 10, interval=0.2)
    assert client.episode_status(ep.episode_id).state is EpisodeState.expired
    with pytest.raises(SwarmHTTPError) as info:
        ep.finish(1.0)
    assert info.value.status == 410 and info.value.code == "gone"


def test_finishing_twice_same_body_is_a_noop_different_body_a_conflict(client: SwarmClient) -> None:
    ep = client.claim("t-twice")
    try:
        ep.finish(0.5)
        assert ep.finish(0.5).reward == 0.5
        with pytest.raises(SwarmHTTPError) as info:
            ep.finish(0.9)
        assert info.value.status == 409
    finally:
        ep.close()


def test_client_errors_are_not_retried(server: ServeProcess) -> None:
    start = time.monotonic()
    with SwarmClient(server.url, token="wrong-token", retry_for_s=30) as bad, pytest.raises(SwarmHTTPError) as info:
        bad.status()
    assert info.value.status == 401 and info.value.code == "unauthorized"
    assert time.monotonic() - start < 5  # a 4xx is an answer, not an outage


def test_invalid_config_patch_is_a_clear_4xx(client: SwarmClient) -> None:
    with pytest.raises(SwarmHTTPError) as info:
        client.patch_config(not_a_key=1)
    assert 400 <= info.value.status < 500 and "not_a_key" in info.value.message


def test_unreachable_server_raises_unavailable_after_the_window() -> None:
    with SwarmClient("http://127.0.0.1:9", token="x", retry_for_s=1.0) as dead:
        start = time.monotonic()
        with pytest.raises(SwarmUnavailable):
            dead.status()
        assert 0.9 <= time.monotonic() - start < 5


def test_token_defaults_to_env_then_token_file(server: ServeProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWARM_TOKEN", raising=False)
    with SwarmClient(server.url, token_file=server.state_dir / "token") as from_file:
        assert from_file.status().state in (ServerState.running, ServerState.training)
    monkeypatch.setenv("SWARM_TOKEN", server.token)
    with SwarmClient(server.url) as from_env:
        assert from_env.token == server.token and from_env.status().model


def test_run_aborts_only_failing_episodes_and_groups_tasks(client: SwarmClient) -> None:
    seen: dict[str, set[str]] = {}
    lock = threading.Lock()

    def workflow(ep: EpisodeHandle, task: dict) -> float:
        with lock:
            seen.setdefault(task["task_id"], set()).add(ep.group_id)
        if task["fail"]:
            raise RuntimeError("environment crashed")
        return 0.5 if _ask(ep, task["task_id"]) else 0.25

    tasks = [{"task_id": f"run-{i}", "fail": i == 1} for i in range(3)]
    summary = client.run(tasks, workflow, group_size=2, concurrency=3, progress=False)
    assert (summary.finished, summary.aborted) == (4, 2)
    assert summary.mean_reward is not None and 0.25 <= summary.mean_reward <= 0.5
    assert all(len(groups) == 1 for groups in seen.values())  # one fresh group id per task
    assert len({g for groups in seen.values() for g in groups}) == 3


def test_run_stops_after_episodes_and_accepts_workflows_that_finish_themselves(client: SwarmClient) -> None:
    def endless():
        i = 0
        while True:
            yield {"task_id": f"endless-{i}"}
            i += 1

    def workflow(ep: EpisodeHandle, task: dict) -> None:
        ep.finish(1.0)

    summary = client.run(endless(), workflow, group_size=2, concurrency=2, episodes=5, progress=False)
    assert (summary.finished, summary.aborted, summary.mean_reward) == (5, 0, 1.0)


def test_run_refuses_bad_tasks_and_a_bad_token_stops_it(client: SwarmClient, server: ServeProcess) -> None:
    with pytest.raises(ValueError, match="task_id"):
        client.run([{"id": 1}], lambda ep, task: 1.0, group_size=1, progress=False)
    with SwarmClient(server.url, token="wrong", retry_for_s=5) as bad, pytest.raises(SwarmError):
        bad.run([{"task_id": "x"}], lambda ep, task: 1.0, group_size=1, progress=False)
