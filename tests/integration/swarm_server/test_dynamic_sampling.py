"""DAPO's dynamic sampling (``batch_mode = "varied_groups"``) and the per-step metrics the DAPO and
Dr. GRPO claims are judged on, through a real server on loopback with the tiny model.

With ``random_reward`` (the spurious-rewards control) the trainer sees coin flips while the reward
metrics keep the posted rewards.

A reward function gives every member of some groups the same reward: those groups are dropped when
they complete (recorded in the buffer with their reason, counted in the status and in the next
step's ``train/groups_dropped_uniform``), and the step trains only the groups whose rewards differ.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
from server_harness import RunningServer
from support import wait_for

from swarm.server.records.episode import UNIFORM_REASON
from swarm.server.training.step import coin

MESSAGES = [{"role": "user", "content": "say a"}]


def _play_group(server: RunningServer, task: str, size: int, reward: Callable[[int], float]) -> list[str]:
    """Claim a group of ``size`` members of ``task``, one chat call each, finish member ``i`` with ``reward(i)``."""
    episodes = []
    with server.client() as http:
        for _ in range(size):
            response = http.post("/api/v1/episodes", json={"task_id": task})
            assert response.status_code == 200, response.text
            episodes.append(response.json())
    for i, episode in enumerate(episodes):
        with httpx.Client(base_url=server.url, timeout=300.0,
                          headers={"Authorization": f"Bearer {episode['api_key']}"}) as http:
            chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4 + 2 * i})
            assert chat.status_code == 200, chat.text
            done = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward(i)})
            assert done.status_code == 200, done.text
    return [e["episode_id"] for e in episodes]


def _metrics(server: RunningServer) -> list[dict]:
    with server.client() as http:
        return http.get("/api/v1/metrics", params={"since_step": 0}).json()


def test_groups_with_identical_rewards_are_dropped_recorded_and_counted(start_server) -> None:
    server = start_server(group_size=3, min_group_size=2, batch_groups=1, batch_mode="varied_groups", mode="sync")
    same_ones = _play_group(server, "easy", 3, lambda i: 1.0)    # solved by every member: advantage 0 everywhere
    same_zeros = _play_group(server, "hard", 3, lambda i: 0.0)   # failed by every member
    status = server.status()
    assert status["step"] == 0 and status["groups_dropped_uniform"] == 2
    assert status["episodes"]["dropped"] == 6 and status["drop_reasons"] == {UNIFORM_REASON: 6}

    varied = _play_group(server, "mixed", 3, lambda i: [1.0, 0.0, 0.0][i])  # member 0 right, 1 and 2 wrong
    wait_for(lambda: server.status()["step"] == 1)
    row = _metrics(server)[-1]["metrics"]
    assert row["train/groups_dropped_uniform"] == 2.0 and row["train/episodes"] == 3.0
    # The lengths the claims are judged on: every trained sample, and the negative-advantage ones alone.
    assert row["train/response_length_mean"] > 0 and row["train/response_length_neg_mean"] > 0
    assert row["train/clip_fraction"] == row["train/pg_clipfrac"] and "train/entropy" in row

    # In the buffer: the dropped episodes carry their reason and are never pending (nothing trains twice).
    store = server.core.store
    assert store.drop_reasons() == {UNIFORM_REASON: 6}
    assert {e for _, e, _ in store.training_log()} == set(varied)
    assert not {e.episode_id for e in store.untrained()} & set(same_ones + same_zeros)

    _play_group(server, "easy", 3, lambda i: 1.0)
    _play_group(server, "mixed", 3, lambda i: float(i == 2))
    wait_for(lambda: server.status()["step"] == 2)
    assert _metrics(server)[-1]["metrics"]["train/groups_dropped_uniform"] == 1.0  # since the step before
    assert server.status()["groups_dropped_uniform"] == 3


def test_without_dynamic_sampling_uniform_groups_train(start_server) -> None:
    server = start_server(group_size=2, min_group_size=2, batch_groups=2, mode="sync")
    _play_group(server, "easy", 2, lambda i: 1.0)
    _play_group(server, "mixed", 2, lambda i: float(i))
    wait_for(lambda: server.status()["step"] == 1)
    row = _metrics(server)[-1]["metrics"]
    assert row["train/groups"] == 2.0 and row["train/groups_dropped_uniform"] == 0.0
    assert server.status()["groups_dropped_uniform"] == 0


def test_random_reward_trains_on_coin_flips_and_reports_the_posted_rewards(start_server) -> None:
    server = start_server(group_size=4, min_group_size=2, batch_groups=2, mode="sync", random_reward=0.5)
    ids = _play_group(server, "easy", 4, lambda i: 1.0) + _play_group(server, "also-easy", 4, lambda i: 1.0)
    wait_for(lambda: server.status()["step"] == 1)
    row = _metrics(server)[-1]["metrics"]
    assert row["train/reward_mean"] == 1.0  # what the clients posted
    # The coins of these (random) ids: below 1.0 unless all eight come up 1 (p = 1/256).
    assert row["train/trained_reward_mean"] == sum(coin(e, 0.5) for e in ids) / len(ids)
