"""Issue 3 through the real server: token-exact multi-turn traces, merging, drift, equal losses.

A random tiny model emits arbitrary bytes, which are not valid UTF-8 and so cannot round-trip
through a client's text history. The module therefore warms the model up with the server's own
supervised route (short ASCII answers), checkpoints it, and runs the episodes on that checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from server_harness import RunningServer, launch
from support import wait_for

# The warm-up and several real training steps take more than a few seconds in all.
pytestmark = pytest.mark.slow

SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def warm_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    server = launch(tiny_model, tmp_path_factory.mktemp("warm"))
    try:
        examples = [{"messages": [SYSTEM, {"role": "user", "content": f"turn {i}"}], "completion": f"ok {i}"}
                    for i in range(8)]
        with server.client() as http:
            assert http.post("/api/v1/control/sft", json={"examples": examples, "steps": 10, "batch_size": 8,
                                                          "lr": 0.03}).status_code == 200
            path = http.post("/api/v1/control/checkpoint").json()["detail"]["weights"]
    finally:
        server.stop()
    return Path(path)


def _episode(server: RunningServer, task: str = "t") -> tuple[dict, openai.OpenAI]:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": task}).json()
    return episode, openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)


def _conversation(llm: openai.OpenAI, turns: int, seed: int = 0) -> tuple[list[dict], list]:
    """An agent loop that re-sends the whole history plus the assistant's replies on every call."""
    messages: list[dict] = [SYSTEM]
    calls = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}"})
        reply = llm.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0.0,
                                            logprobs=True, seed=seed + turn)
        text = reply.choices[0].message.content
        assert "\ufffd" not in text, "warm-up should make the model answer in ASCII"
        messages.append({"role": "assistant", "content": text})
        calls.append(reply)
    return messages, calls


def _finish(server: RunningServer, episode: dict, reward: float) -> None:
    with server.client(episode["api_key"]) as http:
        assert http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward}).status_code == 200


def test_multi_turn_calls_merge_into_one_exact_timeline(warm_model: Path, start_server) -> None:
    server = start_server(model_dir=warm_model, group_size=2, min_group_size=2, batch_groups=1)
    episode, llm = _episode(server)
    _, calls = _conversation(llm, turns=4)
    trace = server.core.lifecycle.get(episode["episode_id"]).trace
    assert len(trace.timelines) == 1 and trace.drift_forks == 0 and trace.calls == 4
    [timeline] = trace.timelines
    expected_tokens: list[int] = []
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    for reply in calls:
        prompt = reply.model_extra["prompt_token_ids"]
        ids = reply.choices[0].model_extra["token_ids"]
        assert prompt[: len(expected_tokens)] == expected_tokens  # each call extends the last
        new_context = prompt[len(expected_tokens):]
        expected_tokens += new_context + ids
        expected_mask += [0] * len(new_context) + [1] * len(ids)
        expected_logprobs += [0.0] * len(new_context) + [lp.logprob for lp in reply.choices[0].logprobs.content]
    assert timeline.tokens == expected_tokens
    assert timeline.loss_mask == expected_mask
    assert timeline.logprobs == expected_logprobs
    generated = [t for t, m in zip(timeline.tokens, timeline.loss_mask) if m]
    assert generated == [t for r in calls for t in r.choices[0].model_extra["token_ids"]]


def test_rewritten_history_forks_and_counts_drift(warm_model: Path, start_server) -> None:
    server = start_server(model_dir=warm_model, group_size=2, min_group_size=2, batch_groups=1)
    episodes = []
    for reward in (0.0, 1.0):
        episode, llm = _episode(server)
        _messages, _ = _conversation(llm, turns=2)
        # Summarised memory: the agent rewrites its history before the next call.
        rewritten = [SYSTEM, {"role": "user", "content": "summary of turns 0-1"}]
        llm.chat.completions.create(model="tiny", messages=rewritten, max_tokens=8, temperature=0.0)
        trace = server.core.lifecycle.get(episode["episode_id"]).trace
        assert len(trace.timelines) == 2 and trace.drift_forks == 1
        episodes.append((episode, reward))
    for episode, reward in episodes:
        _finish(server, episode, reward)
    wait_for(lambda: server.core.step == 1)
    metrics = server.core.metrics[0].metrics
    assert metrics["context/drift_forks"] == 2 and metrics["context/samples_per_episode"] == 2


def _train_one_group(server: RunningServer, turns: int) -> dict[str, float]:
    for i, reward in enumerate((0.0, 1.0)):
        episode, llm = _episode(server)
        _conversation(llm, turns=turns, seed=100 * i)
        _finish(server, episode, reward)
    wait_for(lambda: server.core.step == 1)
    return server.core.metrics[0].metrics


@pytest.mark.parametrize("turns", [1, 3])
def test_merged_and_unmerged_steps_give_the_same_loss(warm_model: Path, start_server, turns: int) -> None:
    # Importance weights are off: they depend on the rollout log-probs, which carry batch-dependent
    # float noise (~1e-3) from two separate servers; this test is about the merging arithmetic.
    common = dict(model_dir=warm_model, group_size=2, min_group_size=2, batch_groups=1, rollout_is="off")
    merged = _train_one_group(start_server(**common, merge_timelines=True), turns)
    unmerged = _train_one_group(start_server(**common, merge_timelines=False), turns)
    assert merged["context/merge"] == 1.0 and unmerged["context/merge"] == 0.0
    assert merged["context/samples_per_episode"] == 1.0
    assert unmerged["context/samples_per_episode"] == turns
    assert merged["context/generated_tokens"] == unmerged["context/generated_tokens"]
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert merged[key] == pytest.approx(unmerged[key], rel=1e-4, abs=1e-6), key
    if turns > 1:
        assert merged["context/tokens_trained"] < unmerged["context/tokens_trained"]
