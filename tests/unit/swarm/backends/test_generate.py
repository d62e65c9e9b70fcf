"""Batched sampling: exact log-probs, seeds, stop strings, limits, batch independence."""

from __future__ import annotations

import pytest
import torch

from swarm.backends.base import SamplingParams
from swarm.backends.torch import TorchBackend

# Every test on both decoding caches: the growing one and the static slots a GPU uses by default.
pytestmark = pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)

USER = [{"role": "user", "content": "Spell a word."}]


def _teacher_forced(backend: TorchBackend, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """Log-probs of ``completion`` after ``prompt`` from one plain forward pass (no cache, no padding)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(prompt) - 1 : -1, : backend.vocab_size]
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp.gather(-1, torch.tensor(completion).unsqueeze(-1)).flatten().tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_recorded_logprobs_match_teacher_forcing(backend: TorchBackend, temperature: float) -> None:
    longer = [{"role": "user", "content": "a much longer question here"}]
    prompts = [backend.render_prompt(USER, None), backend.render_prompt(longer, None)]
    params = [SamplingParams(max_tokens=24, temperature=temperature, seed=i) for i in range(2)]
    for prompt, gen in zip(prompts, backend.generate(prompts, params)):
        assert len(gen.token_ids) == len(gen.logprobs) > 0
        expected = _teacher_forced(backend, prompt, gen.token_ids, temperature)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected)) < 1e-4


def test_greedy_picks_the_argmax(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    gen = backend.generate([prompt], [SamplingParams(max_tokens=8, temperature=0.0)])[0]
    ids = list(prompt)
    for token in gen.token_ids:
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([ids])).logits[0, -1, : backend.vocab_size]
            assert token == int(logits.argmax())
        ids.append(token)


def test_same_seed_same_output_and_different_seeds_differ(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    first = backend.generate([prompt], [SamplingParams(max_tokens=16, seed=7)])[0]
    again = backend.generate([prompt], [SamplingParams(max_tokens=16, seed=7)])[0]
    other = backend.generate([prompt], [SamplingParams(max_tokens=16, seed=8)])[0]
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs
    assert first.token_ids != other.token_ids


def test_rows_of_different_lengths_match_generating_each_alone(backend: TorchBackend) -> None:
    prompts = [
        backend.render_prompt(USER, None),
        backend.render_prompt([{"role": "system", "content": "long system prompt " * 4}, *USER], None),
        [97, 98, 99],
    ]
    # Different limits make rows leave the batch at different steps (the cache is pruned then).
    params = [
        SamplingParams(max_tokens=limit, temperature=1.0, seed=11 + i, top_p=0.95 if i == 1 else 1.0)
        for i, limit in enumerate((5, 20, 12))
    ]
    batched = backend.generate(prompts, params)
    for prompt, p, together in zip(prompts, params, batched):
        alone = backend.generate([prompt], [p])[0]
        assert alone.token_ids == together.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, together.logprobs)) < 1e-4
        assert alone.finish_reason == together.finish_reason


def test_max_tokens_is_respected_per_row(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    gens = backend.generate([prompt, prompt], [SamplingParams(max_tokens=3, seed=1), SamplingParams(max_tokens=9, seed=2)])
    for gen, limit in zip(gens, (3, 9)):
        assert len(gen.token_ids) <= limit
        if gen.finish_reason == "length":
            assert len(gen.token_ids) == limit


def test_stop_string_cuts_before_the_token_where_it_begins(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    free = backend.generate([prompt], [SamplingParams(max_tokens=40, temperature=0.0)])[0]
    text = backend.decode(free.token_ids)
    assert len(free.token_ids) == 40 and len(text) >= 6, "greedy run should produce text to cut"
    starts = [i for i in range(2, len(text) - 1) if "\ufffd" not in text[i : i + 2]]
    stop = text[starts[0] : starts[0] + 2]
    streamed: list[tuple[int, int, float, None]] = []
    gen = backend.generate(
        [prompt], [SamplingParams(max_tokens=40, temperature=0.0, stop=(stop, "never-there"))],
        on_token=lambda *a: streamed.append(a),
    )[0]
    returned = backend.decode(gen.token_ids)
    assert gen.finish_reason == "stop"
    assert stop not in returned
    assert returned == text[: text.index(stop)][: len(returned)]
    assert gen.token_ids == free.token_ids[: len(gen.token_ids)]
    assert gen.logprobs == free.logprobs[: len(gen.logprobs)]
    assert [t for _, t, _, _ in streamed] == gen.token_ids  # nothing streamed that was later cut


def test_eos_ends_a_row_and_is_kept(backend: TorchBackend) -> None:
    im_end = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def favour_im_end(module, inputs, logits):  # steer the real model: <|im_end|> becomes the argmax
        boosted = logits.clone()
        boosted[..., im_end] += 1e4
        return boosted

    backend.model.lm_head.register_forward_hook(favour_im_end)
    prompt = backend.render_prompt(USER, None)
    streamed: list[int] = []
    gen = backend.generate([prompt], [SamplingParams(max_tokens=10, seed=0)],
                           on_token=lambda r, t, lp, top: streamed.append(t))[0]
    assert gen.token_ids == [im_end] and gen.finish_reason == "stop"
    assert streamed == [im_end]
    assert backend.decode(gen.token_ids) == ""


def test_streaming_reports_every_token_in_order(backend: TorchBackend) -> None:
    prompts = [backend.render_prompt(USER, None), [104, 105]]
    seen: dict[int, list[tuple[int, float]]] = {0: [], 1: []}
    gens = backend.generate(prompts, [SamplingParams(max_tokens=12, seed=3)] * 2,
                            on_token=lambda r, t, lp, top: seen[r].append((t, lp)))
    for row, gen in enumerate(gens):
        assert seen[row] == list(zip(gen.token_ids, gen.logprobs))


def test_context_overflow_and_bad_params_raise(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    with pytest.raises(ValueError, match="exceed"):
        backend.generate([prompt], [SamplingParams(max_tokens=backend.max_context)])
    bads = (SamplingParams(max_tokens=0), SamplingParams(max_tokens=4, temperature=-1), SamplingParams(max_tokens=4, top_p=0))
    for bad in bads:
        with pytest.raises(ValueError):
            backend.generate([prompt], [bad])
    with pytest.raises(ValueError):
        backend.generate([[]], [SamplingParams(max_tokens=4)])
    with pytest.raises(ValueError):
        backend.generate([[10_000]], [SamplingParams(max_tokens=4)])
    with pytest.raises(ValueError):
        backend.generate([prompt, prompt], [SamplingParams(max_tokens=4)])


def test_tiny_top_p_keeps_only_the_top_token_and_logprobs_are_renormalised(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    greedy = backend.generate([prompt], [SamplingParams(max_tokens=12, temperature=0.0)])[0]
    nucleus = backend.generate([prompt], [SamplingParams(max_tokens=12, temperature=1.0, top_p=1e-6, seed=4)])[0]
    assert nucleus.token_ids == greedy.token_ids
    assert all(lp < -1.0 for lp in greedy.logprobs)  # a random model: far from probability 1 at T = 1
    # The nucleus is one token: the distribution sampled from gives it probability 1 (vLLM's processed_logprobs).
    assert nucleus.logprobs == [0.0] * len(nucleus.token_ids)


def test_only_tokenizer_ids_are_sampled(backend: TorchBackend) -> None:
    assert backend.vocab_size == len(backend.tokenizer) < backend.model.config.vocab_size
    gens = backend.generate([[104, 105]] * 8, [SamplingParams(max_tokens=32, seed=i) for i in range(8)])
    assert max(t for g in gens for t in g.token_ids) < backend.vocab_size
