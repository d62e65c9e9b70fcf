"""Constrained decoding on the torch engine (tiny preset): a row with a grammar samples only ids the
grammar allows, records ``log_softmax`` over that allowed set (after temperature) as its log-prob,
ends when the grammar is complete, and leaves the rows beside it unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch
from llguidance import LLMatcher

from swarm.backends.base import SamplingParams
from swarm.backends.torch import TorchBackend
from swarm.text.constraints import json_grammar, response_grammar, tool_call_grammar
from swarm.text.parsers import parse_reply

USER = [{"role": "user", "content": "Give me a point."}]
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "ok": {"type": "boolean"}},
         "required": ["x", "ok"], "additionalProperties": False}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}


def _masked_logprobs(backend: TorchBackend, prompt: list[int], ids: list[int], grammar: str,
                     temperature: float) -> list[torch.Tensor]:
    """Per step, ``log_softmax(logits / T)`` over the ids a fresh matcher allows after the ids before."""
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1, : backend.vocab_size]
    matcher = LLMatcher(backend._setup.grammars._llg_tokenizer(), LLMatcher.grammar_from_lark(grammar))
    out = []
    for step, token in enumerate(ids):
        bits = matcher.compute_bitmask()
        allowed = torch.tensor([bits[i // 8] >> (i % 8) & 1 for i in range(backend.vocab_size)], dtype=torch.bool)
        out.append(torch.log_softmax(logits[step].float().masked_fill(~allowed, -math.inf) / temperature, dim=-1))
        assert matcher.consume_token(token)
    return out


@pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)
def test_a_constrained_token_records_the_log_softmax_over_the_allowed_set(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    grammar = json_grammar(POINT)
    constrained = SamplingParams(max_tokens=60, temperature=0.7, seed=3, grammar=grammar)
    plain = SamplingParams(max_tokens=8, seed=1)
    gen, beside = backend.generate([prompt, prompt], [constrained, plain])
    assert gen.finish_reason == "stop" and gen.token_ids[-1] in backend._setup.eos_ids
    value = json.loads(backend.decode(gen.token_ids))
    assert set(value) == {"x", "ok"} and isinstance(value["x"], int) and isinstance(value["ok"], bool)
    expected = _masked_logprobs(backend, prompt, gen.token_ids, grammar, 0.7)
    for step, (token, logprob) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True)):
        assert logprob == pytest.approx(float(expected[step][token]), abs=1e-4)
    assert backend.generate([prompt], [plain])[0].token_ids == beside.token_ids  # the neighbour is untouched


def test_a_forced_call_parses_and_json_object_is_an_object(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, [ADD])
    added = backend.tokenizer.get_added_vocab()
    grammar = tool_call_grammar([ADD], {"type": "function", "function": {"name": "add"}}, "hermes", added.get)
    assert grammar is not None
    # Sampled, not greedy: the untrained model's argmax repeats one digit, so an integer never ends.
    gen = backend.generate([prompt], [SamplingParams(max_tokens=200, temperature=1.0, seed=0, grammar=grammar)])[0]
    reply = parse_reply(backend.decode(gen.token_ids), tool_parser="hermes", reasoning_parser=None)
    assert reply.parse_error is None and [c.name for c in reply.tool_calls] == ["add"]
    assert set(json.loads(reply.tool_calls[0].arguments)) == {"a", "b"}

    obj = response_grammar({"type": "json_object"})
    gen = backend.generate([prompt], [SamplingParams(max_tokens=300, temperature=1.0, seed=0, grammar=obj)])[0]
    assert gen.finish_reason == "stop" and isinstance(json.loads(backend.decode(gen.token_ids)), dict)


def test_a_grammar_that_does_not_compile_is_refused(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    with pytest.raises(ValueError, match="cannot be compiled"):
        backend.generate([prompt], [SamplingParams(max_tokens=4, grammar="start: %json {\"type\": \"nope\"}")])
