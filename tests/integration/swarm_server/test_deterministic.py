"""Deterministic runs (``swarm serve --deterministic``, issue 61): two servers with the same seed and
config, each trained for a few sync-mode steps by a real ``SwarmClient.run`` over the same tasks, one
client running one episode at a time and the other four, sample the same token ids, post the same
rewards and log the same step metrics (wall-clock and throughput metrics aside)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from support import wait_for

from swarm.client import EpisodeHandle, SwarmClient

_TASKS = [{"task_id": f"task-{i}", "word": word} for i, word in enumerate(["cab", "bead", "dab", "ace", "bed", "fad"])]
_CONFIG: dict[str, Any] = {"mode": "sync", "group_size": 2, "min_group_size": 2, "batch_groups": 2, "max_tokens": 8,
                           "lr": 0.02}
_LETTERS = set(b"abcdef")  # the reward: the share of these bytes among the sampled ids
_TIMED = ("perf/", "time/")  # wall-clock and throughput: they differ run to run by nature


def _train(server: Any, concurrency: int) -> tuple[list[tuple[Any, ...]], list[dict[str, float]]]:
    """Run every task once as a group of 2 at ``concurrency``; return what each episode sampled and got
    (sorted: which client thread played which member is arrival order) and the step metrics."""
    played: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def workflow(ep: EpisodeHandle, task: dict) -> float:
        messages = [{"role": "user", "content": f"Spell {task['word']}."}]
        ids: list[list[int]] = []
        for _ in range(2):  # two calls: the second continues the first (a multi-turn episode)
            reply = ep.openai().chat.completions.create(model="policy", messages=messages)
            ids.append(list((reply.choices[0].model_extra or {})["token_ids"]))
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": "Again."}]
        reward = sum(token in _LETTERS for token in ids[0] + ids[1]) / 16
        with lock:
            played.append((ep.policy_version, task["task_id"], tuple(map(tuple, ids)), reward))
        return reward

    with SwarmClient(server.url, token=server.token) as client:
        client.run(iter(_TASKS), workflow, group_size=2, concurrency=concurrency, progress=False)
        wait_for(lambda: client.status().step == 3, 60, what="the third step")
        metrics = [{k: v for k, v in row.metrics.items() if not k.startswith(_TIMED)} for row in client.metrics()]
    return sorted(played), metrics


def test_same_seed_and_config_give_the_same_run_at_any_concurrency(start_server: Callable[..., Any]) -> None:
    one = start_server(seed=3, deterministic=True, **_CONFIG)
    four = start_server(seed=3, deterministic=True, **_CONFIG)
    played_one, metrics_one = _train(one, concurrency=1)
    played_four, metrics_four = _train(four, concurrency=4)
    assert [version for version, *_ in played_one] == [0] * 4 + [1] * 4 + [2] * 4  # one batch per version
    assert played_four == played_one  # token ids, rewards and the version that sampled them
    assert len(metrics_one) == 3 and metrics_four == metrics_one
    assert len({reward for *_, reward in played_one}) > 1  # the steps had something to learn from


def _untrained(played: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each task's samples (ids and reward) drawn by the untrained policy (version 0)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for version, task, ids, reward in played:
        if version == 0:
            out.setdefault(task, []).append((ids, reward))
    return {task: sorted(samples) for task, samples in out.items()}


def test_coupled_arms_sample_the_same_tokens_until_their_policies_part(start_server: Callable[..., Any]) -> None:
    """``--coupled``: two arms of one seed that differ only in learning rate sample the same tokens for each
    task both sampled with the untrained policy (version 0), keyed noise in batched decoding, whatever the
    concurrency, while their updates differ. Uncoupled arms of the same seed differ at
    version 0 already (a shared stream's draws go out in arrival order). Coupled mode keeps the config's
    admission, so how many groups each arm starts before its first step may differ: tasks are compared
    where both arms sampled them."""
    coupled = [start_server(seed=5, coupled=True, **{**_CONFIG, "lr": lr}) for lr in (0.02, 0.002)]
    fast, fast_metrics = _train(coupled[0], concurrency=4)
    slow, slow_metrics = _train(coupled[1], concurrency=1)
    both = _untrained(fast).keys() & _untrained(slow).keys()
    assert both and all(_untrained(fast)[t] == _untrained(slow)[t] for t in both)
    assert fast_metrics != slow_metrics  # the learning rates still differ: so do the updates
    uncoupled = [start_server(seed=5, **{**_CONFIG, "lr": lr}) for lr in (0.02, 0.002)]
    a, b = _untrained(_train(uncoupled[0], concurrency=4)[0]), _untrained(_train(uncoupled[1], concurrency=1)[0])
    assert a.keys() & b.keys() and all(a[t] != b[t] for t in a.keys() & b.keys())
