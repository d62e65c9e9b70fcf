"""vLLM's sampling extensions on the torch engine (tiny preset), the log-probs it records for them,
alternatives in the token callback, the vLLM request body, and chunked training log-probs."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import pytest
import torch

from swarm.backends.base import SamplingParams
from swarm.backends.torch import TorchBackend
from swarm.backends.torch import logprobs as chunked
from swarm.backends.vllm.chat import cut_at_stop
from swarm.backends.vllm.completions import completion_body

USER = [{"role": "user", "content": "Spell a word."}]


def _favour_im_end(backend: TorchBackend) -> int:
    """Steer the real model so that ``<|im_end|>`` is the argmax at every step; returns its id."""
    im_end = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def hook(module, inputs, logits):
        boosted = logits.clone()
        boosted[..., im_end] += 1e4
        return boosted

    backend.model.lm_head.register_forward_hook(hook)
    return im_end


def _processed(backend: TorchBackend, prompt: Sequence[int], ids: Sequence[int],
               p: SamplingParams) -> list[torch.Tensor]:
    """Per step, the distribution the row should have sampled from, computed here from the plain
    formulas (vLLM's order): min_tokens mask, penalties, temperature, min_p, top_k, top_p."""
    with torch.no_grad():
        logits = backend.model(torch.tensor([list(prompt) + list(ids)])).logits[0, len(prompt) - 1 : -1]
    logits = logits[:, : backend.vocab_size].float()
    out = []
    for step in range(len(ids)):
        x = logits[step].clone()
        history = list(ids[:step])
        if step < p.min_tokens:
            x[sorted(backend._setup.eos_ids | set(p.stop_token_ids))] = -math.inf
        for t in set(prompt) | set(history):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        for t in set(history):
            x[t] -= p.frequency_penalty * history.count(t) + p.presence_penalty
        if p.temperature == 0:
            out.append(torch.log_softmax(x, dim=-1))
            continue
        x = x / p.temperature
        probs = torch.softmax(x, dim=-1)
        x[probs < p.min_p * probs.max()] = -math.inf
        if p.top_k:
            x[x < x.sort(descending=True).values[p.top_k - 1]] = -math.inf
        if p.top_p < 1:
            probs = torch.softmax(x, dim=-1)
            mass = 0.0
            for i in probs.argsort(descending=True).tolist():
                if mass >= p.top_p:
                    x[i] = -math.inf
                mass += float(probs[i])
        out.append(torch.log_softmax(x, dim=-1))
    return out


def test_ignore_eos_runs_to_max_tokens(backend: TorchBackend) -> None:
    im_end = _favour_im_end(backend)
    prompt = backend.render_prompt(USER, None)
    plain, ignoring = backend.generate([prompt] * 2, [SamplingParams(max_tokens=32, seed=1),
                                                      SamplingParams(max_tokens=32, seed=1, ignore_eos=True)])
    assert plain.token_ids == [im_end] and plain.finish_reason == "stop"
    assert len(ignoring.token_ids) == 32 and ignoring.finish_reason == "length"
    assert ignoring.token_ids[0] == im_end  # still sampled, it just does not end the row


def test_top_k_one_is_greedy(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    greedy = backend.generate([prompt], [SamplingParams(max_tokens=24, temperature=0.0)])[0]
    top1 = backend.generate([prompt], [SamplingParams(max_tokens=24, temperature=1.3, top_k=1, seed=9)])[0]
    assert top1.token_ids == greedy.token_ids
    assert top1.logprobs == [0.0] * len(top1.token_ids)  # the processed distribution has one id


def test_min_tokens_delays_the_end(backend: TorchBackend) -> None:
    im_end = _favour_im_end(backend)
    prompt = backend.render_prompt(USER, None)
    gen = backend.generate([prompt], [SamplingParams(max_tokens=20, temperature=0.0, min_tokens=5)])[0]
    assert len(gen.token_ids) == 6 and gen.token_ids[5] == im_end and gen.finish_reason == "stop"
    assert im_end not in gen.token_ids[:5]


def test_stop_token_ids_end_a_row_and_are_kept(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    free = backend.generate([prompt], [SamplingParams(max_tokens=24, temperature=0.0)])[0]
    assert len(free.token_ids) == 24
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    streamed: list[int] = []
    gen = backend.generate([prompt], [SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop_id,))],
                           on_token=lambda r, t, lp, top: streamed.append(t))[0]
    assert gen.token_ids == free.token_ids[: first + 1] and gen.finish_reason == "stop"
    assert streamed == gen.token_ids
    # Before min_tokens the id cannot be sampled, so the row goes on past it.
    held = backend.generate([prompt], [SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(stop_id,),
                                                      min_tokens=first + 1)])[0]
    assert len(held.token_ids) > first + 1 and stop_id not in held.token_ids[: first + 1]


def test_min_tokens_ignores_stop_strings_in_the_first_tokens(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    free = backend.generate([prompt], [SamplingParams(max_tokens=40, temperature=0.0)])[0]
    text = backend.decode(free.token_ids)
    stop = next(text[i : i + 2] for i in range(2, len(text) - 1) if "\ufffd" not in text[i : i + 2])
    early = backend.generate([prompt], [SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,))])[0]
    late = backend.generate([prompt], [SamplingParams(max_tokens=40, temperature=0.0, stop=(stop,), min_tokens=12)])[0]
    assert len(late.token_ids) > len(early.token_ids)
    # The same rule as the vLLM engine's cut (vLLM's detokenizer: a stop string must end past them).
    expected = cut_at_stop(free.token_ids, (stop,), backend.decode, min_tokens=12)
    assert late.token_ids == free.token_ids[: len(free.token_ids) if expected is None else expected]


def test_repetition_penalty_changes_the_distribution(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    plain = SamplingParams(max_tokens=12, temperature=0.0)
    penalised = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.8)
    a, b = backend.generate([prompt] * 2, [plain, penalised])
    assert abs(a.logprobs[0] - b.logprobs[0]) > 1e-3 or a.token_ids[0] != b.token_ids[0]
    expected = _processed(backend, prompt, b.token_ids, penalised)
    for step, (token, logprob) in enumerate(zip(b.token_ids, b.logprobs)):
        assert int(expected[step].argmax()) == token  # greedy on the penalised logits
        assert logprob == pytest.approx(float(expected[step][token]), abs=1e-4)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=10, temperature=0.8, seed=5, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=1.3,
                   presence_penalty=0.4, frequency_penalty=0.3, min_tokens=3, top_logprobs=5),
    SamplingParams(max_tokens=10, temperature=1.2, seed=6, top_p=0.5, top_logprobs=3),
    SamplingParams(max_tokens=10, temperature=0.0, frequency_penalty=1.5, top_logprobs=2),
    SamplingParams(max_tokens=6, temperature=1.0, seed=7, top_k=2, top_logprobs=4),  # dropped ids among the top 4
], ids=["everything", "top_p", "greedy_penalised", "top_k_below_alternatives"])
def test_recorded_logprobs_are_the_processed_distribution(backend: TorchBackend, params: SamplingParams) -> None:
    prompt = backend.render_prompt(USER, None)
    neighbour = SamplingParams(max_tokens=6, seed=1)  # a plain row in the same batch changes nothing
    gen = backend.generate([prompt, prompt], [params, neighbour])[0]
    expected = _processed(backend, prompt, gen.token_ids, params)
    assert gen.top_logprobs is not None
    for step, (token, logprob, alternatives) in enumerate(zip(gen.token_ids, gen.logprobs, gen.top_logprobs)):
        dist = expected[step]
        assert math.isfinite(float(dist[token]))  # only kept ids are drawn
        assert logprob == pytest.approx(float(dist[token]), abs=1e-4)
        values, _ = dist.topk(params.top_logprobs)
        assert [lp for _, lp in alternatives] == pytest.approx(values.clamp(min=-9999.0).tolist(), abs=1e-4)
        assert all(float(dist[t]) == pytest.approx(lp, abs=1e-4) for t, lp in alternatives if lp > -9999.0)
        if params.top_k and params.top_k < params.top_logprobs:
            assert [lp for _, lp in alternatives][params.top_k:] == [-9999.0] * (params.top_logprobs - params.top_k)


def test_top_alternatives_reach_on_token(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    seen: dict[int, list] = {0: [], 1: []}
    gens = backend.generate([prompt] * 2, [SamplingParams(max_tokens=8, seed=2, top_logprobs=3),
                                           SamplingParams(max_tokens=8, seed=3)],
                            on_token=lambda r, t, lp, top: seen[r].append((t, lp, top)))
    assert seen[0] == list(zip(gens[0].token_ids, gens[0].logprobs, gens[0].top_logprobs))
    assert all(len(top) == 3 for _, _, top in seen[0])
    assert seen[1] == [(t, lp, None) for t, lp in zip(gens[1].token_ids, gens[1].logprobs)]


def test_bad_extension_params_raise(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    bad = {
        "top_k": SamplingParams(max_tokens=4, top_k=-1),
        "min_p": SamplingParams(max_tokens=4, min_p=1.5),
        "repetition_penalty": SamplingParams(max_tokens=4, repetition_penalty=0.0),
        "presence_penalty": SamplingParams(max_tokens=4, presence_penalty=2.5),
        "frequency_penalty": SamplingParams(max_tokens=4, frequency_penalty=-3.0),
        "min_tokens": SamplingParams(max_tokens=4, min_tokens=5),
        "stop_token_ids": SamplingParams(max_tokens=4, stop_token_ids=(backend.vocab_size,)),
    }
    for name, params in bad.items():
        with pytest.raises(ValueError, match=name):
            backend.generate([prompt], [params])


def test_vllm_body_carries_only_the_extensions_a_row_sets() -> None:
    plain = completion_body([1, 2], SamplingParams(max_tokens=4), stream=False, eos_ids=[7, 5], padding_ids=range(0))
    assert plain == {"model": "policy", "prompt": [1, 2], "max_tokens": 4, "temperature": 1.0, "top_p": 1.0,
                     "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
                     "stop_token_ids": [5, 7], "skip_special_tokens": True, "stream": False}
    p = SamplingParams(max_tokens=8, top_k=3, min_p=0.1, repetition_penalty=1.2, presence_penalty=0.5,
                       frequency_penalty=-0.5, min_tokens=2, stop_token_ids=(9, 5))
    body = completion_body([1], p, stream=True, eos_ids=[7, 5], padding_ids=range(0))
    assert {k: body[k] for k in ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                                 "min_tokens")} == {"top_k": 3, "min_p": 0.1, "repetition_penalty": 1.2,
                                                    "presence_penalty": 0.5, "frequency_penalty": -0.5, "min_tokens": 2}
    assert body["stop_token_ids"] == [5, 7, 9] and "ignore_eos" not in body
    ignoring = completion_body([1], SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=(9,)), stream=False,
                               eos_ids=[7, 5], padding_ids=range(0))
    assert ignoring["ignore_eos"] is True and ignoring["stop_token_ids"] == [9]
    biased = completion_body([1], SamplingParams(max_tokens=8, logit_bias=((3, -100.0), (11, 2.5))), stream=False,
                             eos_ids=[7], padding_ids=range(10, 12))
    assert biased["logit_bias"] == {"10": -100.0, "11": 2.5, "3": -100.0}  # the request's own bias wins over padding
    grammar = 'start: %json {"type": "object"}'
    constrained = completion_body([1], SamplingParams(max_tokens=8, grammar=grammar), stream=False, eos_ids=[7],
                                  padding_ids=range(0))
    assert constrained["structured_outputs"] == {"grammar": grammar}  # vLLM 0.32's field


def test_chunked_training_logprobs_equal_the_full_ones(backend: TorchBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, backend.vocab_size, (3, 40), generator=generator)
    temperatures = torch.tensor([1.0, 0.7, 1.3])
    weights = torch.rand(3, 39, generator=generator)
    results = {}
    for chunk in (None, 7 * backend.vocab_size):  # full logits; chunks of 7 positions
        monkeypatch.setattr(chunked, "CHUNK_LOGITS", chunk)
        model = copy.deepcopy(backend.model).train()
        logp, entropy = chunked.token_logprobs(model, tokens, temperatures, backend.vocab_size, with_entropy=True)
        (logp * weights).sum().backward()
        results[chunk] = logp.detach(), entropy, {name: p.grad for name, p in model.named_parameters()}
    (full, full_entropy, full_grads), (part, part_entropy, part_grads) = results.values()
    torch.testing.assert_close(part, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(part_entropy, full_entropy, atol=1e-5, rtol=0)
    for name, grad in full_grads.items():
        torch.testing.assert_close(part_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
