"""SmolLM2-135M-Instruct (``--model smollm2-135m``, pretrained weights from a registry package) on every
engine pair: the torch engine, vLLM with the torch trainer, the torch engine with verl's trainer on
two FSDP2 workers, and a pool worker (``swarm worker``) serving every call for a server without its own.
Each answers a sum greedily where it can and trains three on-policy steps whose recorded sampled
log-probs equal the trainer's recomputation (``rollout/logprob_diff_mean``).

The model is converted once per machine into the model cache (``SWARM_MODEL_CACHE``, set by
tests/conftest.py; ~35 s); each server then loads the converted folder in seconds. The torch pair runs
in the default test run; the vLLM, verl and pool pairs (a vLLM child, a Ray cluster with two FSDP2
workers or a second process holding the 135M model: minutes each on 2 cores) run with ``-m study``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from support import ServeProcess, WorkerProcess, free_port, wait_for

from swarm.client import SwarmClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Sync mode: every sample is on-policy, so the recorded log-probs must equal the recomputation.
CONFIG = """
model = "smollm2-135m"
group_size = 2
min_group_size = 2
batch_groups = 1
mode = "sync"
lr = 1e-5
max_tokens = 8
temperature = 1.0
"""
QUESTION = "What is 7 + 5? Answer with a number only."
BOUND = 1e-3  # the engines' token-exactness bound (test_vllm_server, test_learning)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from swarm.models.resolve import resolve_model_folder

    return resolve_model_folder("smollm2-135m")  # converted once, before any server's clock starts


def _serve(tmp: Path, *extra: str, timeout_s: float) -> Iterator[ServeProcess]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.toml").write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp / "state", config=tmp / "config.toml", extra_args=extra,
                          model=None)
    server.start(timeout_s)
    try:
        yield server
    finally:
        server.stop()


def _greedy(server: ServeProcess) -> str:
    models = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {server.token}"}).json()
    assert [m["id"] for m in models["data"]] == ["smollm2-135m"]
    reply = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {server.token}"},
                       json={"messages": [{"role": "user", "content": QUESTION}], "temperature": 0.0,
                             "max_tokens": 12}, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def _train_three_steps(server: ServeProcess) -> list[dict[str, float]]:
    """Three groups of two sampled replies with different rewards: three steps; their metrics."""
    with SwarmClient(server.url, token=server.token, retry_for_s=120) as client:
        start = client.status().step
        for round_ in range(3):
            for reward in (0.0, 1.0):
                episode = client.claim(f"sum-{round_}", group_id=f"sum-{round_}")
                llm = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0, timeout=300)
                llm.chat.completions.create(model="policy", messages=[{"role": "user", "content": QUESTION}])
                episode.finish(reward=reward)
            wait_for(lambda r=round_: client.status().step >= start + r + 1, 300, what=f"step {start + round_ + 1}",
                     interval=0.5)
        return [m.metrics for m in client.metrics(since_step=start)]


def _assert_token_exact(steps: list[dict[str, float]]) -> None:
    assert len(steps) == 3
    for metrics in steps:
        assert metrics["train/episodes"] == 2
        assert metrics["rollout/logprob_diff_mean"] < BOUND, metrics
        assert metrics["train/loss"] == metrics["train/loss"]  # finite, not NaN


def test_torch_engine_answers_and_trains_token_exact(smollm2: Path, tmp_path: Path) -> None:
    for server in _serve(tmp_path, timeout_s=180):
        assert "12" in _greedy(server)
        _assert_token_exact(_train_three_steps(server))


@pytest.mark.study
def test_vllm_engine_answers_and_trains_token_exact(smollm2: Path, tmp_path: Path) -> None:
    for server in _serve(tmp_path, "--engine", "vllm", timeout_s=420):
        assert "12" in _greedy(server)
        _assert_token_exact(_train_three_steps(server))


@pytest.mark.study
def test_verl_trainer_on_two_workers_trains_token_exact(smollm2: Path, tmp_path: Path) -> None:
    for server in _serve(tmp_path, "--trainer", "verl", "--workers", "2", timeout_s=420):
        _assert_token_exact(_train_three_steps(server))


@pytest.mark.study
def test_a_pool_worker_answers_and_trains_token_exact(smollm2: Path, tmp_path: Path) -> None:
    for server in _serve(tmp_path, "--no-local-generator", timeout_s=180):
        worker = WorkerProcess(server, "w0", ("--model", "smollm2-135m")).start()
        try:
            worker.wait_ready(300)  # it joins, then takes the server's weights
            assert "12" in _greedy(server)
            _assert_token_exact(_train_three_steps(server))
        finally:
            worker.stop()
