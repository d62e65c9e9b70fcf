"""The vLLM generator against a real vLLM child on the tiny preset (CPU, float32).

One child serves the whole module (start-up takes 35-60 s here); the tests share one event loop
(``asyncio.Runner``) because the generator's client and events belong to it. The SIGKILL test
restarts the child, so it runs last. Reference log-probs come straight from the torch model:
``log_softmax(logits / T)`` over the tokenizer's ids, the quantity the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support import wait_for

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.vllm import (
    GeneratorUnavailable,
    VllmGenerator,
    VllmProcess,
    VllmStartError,
    WeightSyncError,
    find_vllm_python,
)
from swarm.weights.transfer import DiskTransfer

pytestmark = pytest.mark.timeout(600)

TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture(scope="module")
def generator(runner: asyncio.Runner, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmGenerator]:
    state = tmp_path_factory.mktemp("vllm-state")
    gen = VllmGenerator.launch(tiny_dir, state, max_model_len=512, start_timeout=300)
    runner.run(gen.start())
    try:
        yield gen
    finally:
        runner.run(gen.close())
        pid = getattr(gen.server, "pid", None)
        assert pid is None or not _group_alive(pid)


@pytest.fixture(scope="module")
def reference(tiny_dir: Path):
    """A torch copy of the weights vLLM serves; tests that change vLLM's weights change this too."""
    from swarm.backends.torch import TorchBackend

    return TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)


def _group_alive(pgid: int) -> bool:
    """True if a live (non-zombie) process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else None
        except OSError:
            continue
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def torch_logprobs(backend, prompt: Sequence[int], ids: Sequence[int], temperature: float) -> list[float]:
    import torch

    tokens = torch.tensor([list(prompt) + list(ids)])
    with torch.no_grad():
        logits = backend.model(tokens).logits[0, len(prompt) - 1 : -1, : backend.vocab_size].float()
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(list(ids)).unsqueeze(-1)).flatten().tolist()


def mismatch(backend, prompt: Sequence[int], generations, temperature: float) -> tuple[float, float]:
    diffs = [
        abs(a - b)
        for g in generations
        for a, b in zip(torch_logprobs(backend, prompt, g.token_ids, temperature), g.logprobs, strict=True)
    ]
    return sum(diffs) / len(diffs), max(diffs)


@pytest.fixture(scope="module")
def prompt(generator: VllmGenerator) -> list[int]:
    return generator.text.render([{"role": "user", "content": "spell some letters"}], None)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_token_exact_generation_matches_torch_logprobs(runner, generator, reference, prompt, temperature) -> None:
    params = [SamplingParams(max_tokens=24, temperature=temperature, seed=10 + i) for i in range(3)]
    out = runner.run(generator.generate([prompt] * 3, params))
    assert out.policy_version == 0
    for g in out.generations:
        assert 1 <= len(g.token_ids) <= 24 and len(g.logprobs) == len(g.token_ids)
        assert max(g.token_ids) < generator.chat.vocab_size  # embedding padding is never sampled
        assert g.finish_reason == ("length" if len(g.token_ids) == 24 else "stop")
    mean, worst = mismatch(reference, prompt, out.generations, temperature)
    print(f"logprob mismatch T={temperature}: mean {mean:.2e} max {worst:.2e}")
    assert mean < TOLERANCE and worst < 10 * TOLERANCE


def test_rows_seeds_and_determinism(runner, generator, prompt) -> None:
    params = [SamplingParams(max_tokens=16, seed=s) for s in (1, 1, 2, 3)]
    first = runner.run(generator.generate([prompt] * 4, params))
    again = runner.run(generator.generate([prompt] * 4, params))
    ids = [g.token_ids for g in first.generations]
    assert ids == [g.token_ids for g in again.generations]
    assert ids[0] == ids[1]
    assert len({tuple(i) for i in ids}) >= 2


def test_stop_string_cuts_ids_and_stream(runner, generator, prompt) -> None:
    free = runner.run(generator.generate([prompt], [SamplingParams(max_tokens=40, seed=4)])).generations[0]
    text = generator.text.decode(free.token_ids)
    assert len(text) >= 8, text
    stop = text[4:6]
    streamed: list[int] = []
    out = runner.run(generator.generate(
        [prompt], [SamplingParams(max_tokens=40, seed=4, stop=(stop,))], sink=lambda row, t, lp, top: streamed.append(t)
    )).generations[0]
    cut_text = generator.text.decode(out.token_ids)
    assert out.finish_reason == "stop"
    assert stop not in cut_text and text.startswith(cut_text)
    assert out.token_ids == free.token_ids[: len(out.token_ids)]
    assert out.logprobs == pytest.approx(free.logprobs[: len(out.token_ids)], abs=1e-5)
    assert streamed == out.token_ids


def test_top_logprobs_and_streaming(runner, generator, reference, prompt) -> None:
    import torch

    streamed: list[tuple[int, int, float, list[tuple[int, float]] | None]] = []
    params = [SamplingParams(max_tokens=12, temperature=0.8, seed=s, top_logprobs=2) for s in (5, 6)]
    out = runner.run(generator.generate([prompt, prompt], params, sink=lambda *item: streamed.append(item)))
    for row, g in enumerate(out.generations):
        assert [(t, lp) for r, t, lp, _ in streamed if r == row] == list(zip(g.token_ids, g.logprobs))
        assert g.top_logprobs is not None and len(g.top_logprobs) == len(g.token_ids)
        assert [top for r, _, _, top in streamed if r == row] == g.top_logprobs
        tokens = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = reference.model(tokens).logits[0, len(prompt) - 1 : -1, : reference.vocab_size]
        expected = torch.log_softmax(logits / 0.8, dim=-1).topk(2, dim=-1)
        for pos, alternatives in enumerate(g.top_logprobs):
            assert [t for t, _ in alternatives] == expected.indices[pos].tolist()
            assert [lp for _, lp in alternatives] == pytest.approx(expected.values[pos].tolist(), abs=TOLERANCE)


def test_sampling_extensions_match_the_torch_rules(runner, generator, reference, prompt) -> None:
    """ignore_eos runs to max_tokens, top_k=1 is greedy with log-prob 0, and a top-k + repetition
    penalty row records the log-prob of the distribution it was drawn from (processed_logprobs)."""
    import torch

    params = [SamplingParams(max_tokens=32, seed=1, ignore_eos=True),
              SamplingParams(max_tokens=16, temperature=0.0),
              SamplingParams(max_tokens=16, temperature=1.3, top_k=1, seed=2),
              SamplingParams(max_tokens=12, temperature=0.9, top_k=5, repetition_penalty=1.3, seed=3)]
    ignoring, greedy, top1, penalised = runner.run(generator.generate([prompt] * 4, params)).generations
    assert len(ignoring.token_ids) == 32 and ignoring.finish_reason == "length"
    assert top1.token_ids == greedy.token_ids[: len(top1.token_ids)]
    assert top1.logprobs == pytest.approx([0.0] * len(top1.token_ids), abs=1e-6)
    ids = penalised.token_ids
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1, : reference.vocab_size]
    for step, (token, logprob) in enumerate(zip(ids, penalised.logprobs)):
        x = logits[step].float().clone()
        seen = torch.tensor(sorted(set(prompt) | set(ids[:step])))
        x[seen] = torch.where(x[seen] > 0, x[seen] / 1.3, x[seen] * 1.3)
        x = x / 0.9
        x[x < x.topk(5).values[-1]] = float("-inf")
        assert logprob == pytest.approx(float(torch.log_softmax(x, dim=-1)[token]), abs=TOLERANCE)


def test_bad_requests_raise_value_error(runner, generator, prompt) -> None:
    cases = [
        ([[]], [SamplingParams(max_tokens=4)]),
        ([prompt], [SamplingParams(max_tokens=600)]),  # beyond --max-model-len 512
        ([prompt], [SamplingParams(max_tokens=4, top_p=0.0)]),
        ([[generator.chat.vocab_size]], [SamplingParams(max_tokens=4)]),
        ([prompt], [SamplingParams(max_tokens=4, top_logprobs=50)]),
        ([prompt, prompt], [SamplingParams(max_tokens=4)]),
    ]
    for prompts, params in cases:
        with pytest.raises(ValueError):
            runner.run(generator.generate(prompts, params))


def _train_one_step(reference, prompt: list[int]) -> None:
    """A real supervised update of the torch copy with a large learning rate (weights visibly move)."""
    target = reference.encode("aaaa bbbb")
    sample = TrainSample(
        tokens=prompt + target, loss_mask=[0] * len(prompt) + [1] * len(target),
        rollout_logprobs=[0.0] * (len(prompt) + len(target)), advantage=0.0,
    )
    reference.supervised_step([sample], TrainConfig(lr=0.05))


def test_weight_sync_moves_logprobs_and_version(runner, generator, reference, prompt) -> None:
    params = [SamplingParams(max_tokens=24, seed=20 + i) for i in range(2)]
    before = runner.run(generator.generate([prompt] * 2, params))
    _train_one_step(reference, prompt)
    started = time.monotonic()
    runner.run(generator.load_weights(1, reference.model.state_dict()))
    print(f"weight sync {time.monotonic() - started:.2f} s")
    after = runner.run(generator.generate([prompt] * 2, params))
    assert (before.policy_version, after.policy_version) == (0, 1)
    stale, _ = mismatch(reference, prompt, before.generations, 1.0)
    mean, worst = mismatch(reference, prompt, after.generations, 1.0)
    print(f"after sync: mismatch mean {mean:.2e} max {worst:.2e} (old weights vs new: {stale:.2e})")
    assert stale > 10 * TOLERANCE  # the update changed the model
    assert mean < TOLERANCE and worst < 10 * TOLERANCE
    assert generator.status().policy_version == 1


def test_async_update_lets_running_requests_finish_on_old_weights(runner, generator, reference, prompt) -> None:
    old_state = {k: v.clone() for k, v in reference.model.state_dict().items()}

    async def scenario():
        generator.mode = "async"
        first_token = asyncio.Event()
        try:
            running = asyncio.create_task(generator.generate(
                [prompt], [SamplingParams(max_tokens=300, seed=1)], sink=lambda *_: first_token.set()
            ))
            await first_token.wait()  # the long request is in flight
            _train_one_step(reference, prompt)
            update = asyncio.create_task(generator.load_weights(2, reference.model.state_dict()))
            while not generator.updating:  # the weights are written; new requests are now held back
                await asyncio.sleep(0.01)
            later = asyncio.create_task(generator.generate([prompt], [SamplingParams(max_tokens=8, seed=2)]))
            old = await running
            assert not later.done()  # held back until the update is applied
            return old, await update, await later
        finally:
            generator.mode = "sync"

    old, _, new = runner.run(scenario())
    assert (old.policy_version, new.policy_version) == (1, 2)
    mean_new, _ = mismatch(reference, prompt, new.generations, 1.0)
    assert mean_new < TOLERANCE
    new_state = {k: v.clone() for k, v in reference.model.state_dict().items()}
    reference.model.load_state_dict(old_state)
    try:
        mean_old, _ = mismatch(reference, prompt, old.generations, 1.0)
    finally:
        reference.model.load_state_dict(new_state)
    assert mean_old < TOLERANCE  # every token of the running request came from the old weights


class _BrokenTransfer(DiskTransfer):
    """The disk transfer with an apply that raises, or never returns (a send stuck in NCCL)."""

    def __init__(self, base: DiskTransfer, failure: str) -> None:
        super().__init__(base.model_dir, base.root)
        self.failure = failure

    async def apply(self, url, client, staged, weights) -> None:  # type: ignore[no-untyped-def]
        if self.failure == "raise":
            raise RuntimeError("injected: the broadcast failed")
        await asyncio.Event().wait()


def test_failed_and_hung_publications_then_recover_serves_the_new_version(runner, generator, reference, prompt,
                                                                          tmp_path) -> None:
    """Through an injected transfer, on a second generator attached to the module's vLLM (its restart
    is a health check and a reload: no new child): a raising publication is a ``WeightSyncError``, a
    hung one is cancelled by the caller's timeout with the gate reopened; the old version keeps
    serving; ``recover`` then serves the new weights as the new version."""
    attached = VllmGenerator.attach(generator.server.url, generator.model_dir, tmp_path,
                                    policy_version=generator.policy_version)
    runner.run(attached.start())
    version = generator.policy_version + 1
    params = [SamplingParams(max_tokens=16, seed=8)]
    try:
        _train_one_step(reference, prompt)
        weights = reference.model.state_dict()

        async def scenario():
            default = attached.transfer
            attached.transfer = _BrokenTransfer(default, "raise")
            with pytest.raises(WeightSyncError, match="injected"):
                await attached.load_weights(version, weights)
            attached.transfer = _BrokenTransfer(default, "hang")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(attached.load_weights(version, weights), 1.0)
            assert not attached.updating  # requests are let through again
            stale = await attached.generate([prompt], params)
            attached.transfer = default
            await attached.recover(version, weights)
            return stale, await attached.generate([prompt], params)

        stale, fresh = runner.run(scenario())
        assert (stale.policy_version, fresh.policy_version) == (version - 1, version)
        mean, _ = mismatch(reference, prompt, fresh.generations, 1.0)
        assert mean < TOLERANCE  # the new weights serve
        assert attached.status().restarts == 1 and attached.status().last_error is None
    finally:
        runner.run(attached.close())
    runner.run(generator.load_weights(version, reference.model.state_dict()))  # the module's generator catches up


def test_sigkill_restarts_on_latest_weights(runner, generator, reference, prompt) -> None:
    assert isinstance(generator.server, VllmProcess)
    version = generator.policy_version
    params = [SamplingParams(max_tokens=16, seed=7)]

    async def scenario():
        os.killpg(generator.server.pid, signal.SIGKILL)
        with pytest.raises(GeneratorUnavailable) as failure:
            for _ in range(50):  # the kill lands within a moment
                await generator.generate([prompt], params)
                await asyncio.sleep(0.1)
        assert failure.value.retry_after > 0
        deadline = time.monotonic() + 300
        while True:
            status = generator.status()
            if status.restarts == 1 and status.alive and not status.restarting:
                break
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.5)
        return await generator.generate([prompt], params)

    out = runner.run(scenario())
    assert out.policy_version == version
    mean, _ = mismatch(reference, prompt, out.generations, 1.0)
    assert mean < TOLERANCE  # served by the latest weights, not the folder vLLM first started on
    print(f"restart took {generator.status().start_time_s:.1f} s")


def test_missing_vllm_fails_fast_with_install_hint(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(VllmStartError, match="setup-vllm"):
        find_vllm_python(tmp_path / "no-python")

    import sys

    process = VllmProcess(tiny_dir, tmp_path / "vllm.log", python=sys.executable)  # no vllm in this venv
    started = time.monotonic()
    with pytest.raises(VllmStartError) as failure:
        asyncio.run(process.start(timeout=60))
    assert time.monotonic() - started < 60
    message = str(failure.value)
    assert "No module named 'vllm'" in message and "setup-vllm" in message  # the log's tail, the install line
    assert not process.alive()


def test_a_start_that_hangs_ends_at_its_timeout_without_the_install_line(tiny_dir: Path, tmp_path: Path) -> None:
    """A vLLM that runs but never answers /health (a busy machine) is cut at the timeout, and the error
    does not tell the user to install what is installed."""
    hanging = tmp_path / "python"
    hanging.write_text("#!/bin/sh\nexec sleep 120\n")
    hanging.chmod(0o755)
    process = VllmProcess(tiny_dir, tmp_path / "vllm.log", python=str(hanging))
    with pytest.raises(VllmStartError) as failure:
        asyncio.run(process.start(timeout=2))
    message = str(failure.value)
    assert "did not become healthy within 2 s" in message and "setup-vllm" not in message
    assert not process.alive()


_ORPHAN_SCRIPT = """
import asyncio, sys
from swarm.backends.vllm import VllmProcess

async def main():
    process = VllmProcess(sys.argv[1], sys.argv[2])
    starting = asyncio.create_task(process.start(timeout=300))
    while process.pid is None:
        await asyncio.sleep(0.05)
    print(process.pid, flush=True)
    await starting

asyncio.run(main())
"""


def test_child_dies_with_a_killed_server(tiny_dir: Path, tmp_path: Path) -> None:
    """A server killed without cleanup (SIGKILL) leaves no vLLM process behind."""
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(tiny_dir), str(tmp_path / "vllm.log")],
                              stdout=subprocess.PIPE, text=True)
    try:
        vllm_pid = int(server.stdout.readline())
        time.sleep(1.0)
        assert _group_alive(vllm_pid)
        server.kill()
        server.wait()
        wait_for(lambda: not _group_alive(vllm_pid), 30, what="the vLLM process group to die with the server",
                 interval=0.2)
    finally:
        server.kill()
        server.wait()
