"""The tool-loop drift test on ``swarm serve --model tiny-bpe --engine vllm``: vLLM samples token
ids for a real BPE vocabulary, the swarm parses tool calls out of them and repairs re-sent replies,
and every episode is stored as one timeline holding exactly the sampled ids and log-probs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support import ServeProcess, free_port
from support.tool_loop import assert_one_exact_timeline, non_canonical, tool_loop

from swarm.server.durability.store import EpisodeStore
from swarm.text.templates import ChatText, load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EPISODES = 32
CONFIG = """
group_size = 4
min_group_size = 1
batch_groups = 4096
max_inflight_per_key = 4
lease_s = 3600  # no episode may expire (and lose its trace) before the test finishes it
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bpe_model: Path) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("vllm-bpe")
    (tmp / "config.toml").write_text(CONFIG)
    running = ServeProcess(port=free_port(), state_dir=tmp / "state", config=tmp / "config.toml",
                           extra_args=("--model", str(bpe_model), "--engine", "vllm"))
    running.start(300.0)
    try:
        yield running
    finally:
        running.stop()


def test_tool_loops_on_vllm_stay_one_exact_timeline(server: ServeProcess, bpe_model: Path) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        loops = list(pool.map(lambda i: tool_loop(server.url, server.token, i), range(EPISODES)))
    for loop in loops:
        finished = httpx.post(f"{server.url}/api/v1/episodes/{loop.episode_id}/finish", json={"reward": 0.5},
                              headers={"Authorization": f"Bearer {loop.llm.api_key}"}, timeout=60)
        assert finished.status_code == 200, finished.text
    text = ChatText(load_tokenizer(bpe_model))
    with EpisodeStore(server.state_dir / "buffer.db") as store:
        for loop in loops:
            stored = store.get(loop.episode_id)
            assert stored is not None
            assert_one_exact_timeline(loop, stored.trace.timelines, stored.trace.drift_forks)
    unrepeatable = sum(non_canonical(text, loop) for loop in loops)
    print(f"\nvLLM: {EPISODES} episodes, {unrepeatable} sampled replies not canonical, 0 forks")
    assert unrepeatable > 0


ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}}}


def test_forced_tool_calls_and_json_schema_on_vllm_use_its_structured_outputs(server: ServeProcess) -> None:
    """The grammar a constrained call gets goes to vLLM as ``structured_outputs.grammar``: on an untrained
    model, ``tool_choice: "required"`` still returns a call that parses, and ``json_schema`` a reply that does.
    (vLLM's llguidance 1.7 ignores a blanks pattern: before the grammar went compact, tiny-bpe's many-blank
    tokens filled max_tokens between '{"name"' and ':'.)"""
    import json

    claim = httpx.post(f"{server.url}/api/v1/episodes", json={"task_id": "constrained"},
                       headers={"Authorization": f"Bearer {server.token}"}, timeout=60)
    assert claim.status_code == 200, claim.text
    llm = {"Authorization": f"Bearer {claim.json()['api_key']}"}
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    forced = httpx.post(f"{server.url}/v1/chat/completions", headers=llm, timeout=300, json={
        "model": "policy", "messages": messages, "tools": [ADD], "tool_choice": "required", "max_tokens": 128})
    assert forced.status_code == 200, forced.text
    calls = forced.json()["choices"][0]["message"]["tool_calls"]
    assert calls, forced.json()["choices"][0]
    assert calls and calls[0]["function"]["name"] == "add"
    assert set(json.loads(calls[0]["function"]["arguments"])) == {"a", "b"}
    shaped = httpx.post(f"{server.url}/v1/chat/completions", headers=llm, timeout=300, json={
        "model": "policy", "messages": messages, "response_format": ANSWER, "max_tokens": 64})
    assert shaped.status_code == 200, shaped.text
    assert isinstance(json.loads(shaped.json()["choices"][0]["message"]["content"])["answer"], int)
