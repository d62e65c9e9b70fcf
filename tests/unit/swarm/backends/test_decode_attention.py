"""Grouped decode attention (``swarm.backends.torch.attention``): the same numbers as transformers' SDPA
with repeated keys, on raw tensors and through the real tiny model (4 query heads over 2 key/value heads)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarm.backends.base import SamplingParams, TrainConfig
from swarm.backends.torch import TorchBackend
from swarm.backends.torch.attention import GROUPED_SDPA, grouped_decode_attention, use_grouped_decode


def _attention_inputs(rows: int, queries: int, columns: int, kv_heads: int = 3, groups: int = 3, dim: int = 16):
    generator = torch.Generator().manual_seed(queries)
    query = torch.randn(rows, queries, kv_heads * groups, dim, generator=generator).transpose(1, 2)  # as models make it
    key = torch.randn(rows, kv_heads, columns, dim, generator=generator)
    value = torch.randn(rows, kv_heads, columns, dim, generator=generator)
    mask = torch.ones(rows, 1, queries, columns, dtype=torch.bool)
    mask[: rows // 2, :, :, : columns // 3] = False  # left padding
    if queries > 1:
        mask &= torch.ones(queries, columns, dtype=torch.bool).tril(diagonal=columns - queries)
    module = SimpleNamespace(num_key_value_groups=groups, is_causal=True)
    return module, query, key, value, mask


@pytest.mark.parametrize("queries", [1, 5])
def test_grouped_attention_equals_sdpa_with_repeated_keys(queries: int) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, query, key, value, mask = _attention_inputs(rows=6, queries=queries, columns=20)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    got, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.25)
    assert got.shape == expected.shape == (6, queries, 9, 16)
    if queries == 1:  # attended in place: equal up to rounding
        assert torch.allclose(got, expected, atol=1e-6)
    else:  # many queries (prefill, training): transformers' own SDPA, bit for bit
        assert torch.equal(got, expected)


def test_the_tiny_model_decodes_the_same_tokens_with_grouped_and_repeated_keys(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache="dynamic")
    assert backend.model.config._attn_implementation == GROUPED_SDPA
    prompts = [backend.encode("a prompt of some length " * (1 + i % 4) + str(i)) for i in range(6)]
    params = [SamplingParams(max_tokens=16, seed=i) for i in range(6)]
    grouped = backend.generate(prompts, params)
    sequence = torch.tensor([prompts[0] + grouped[0].token_ids])
    with torch.inference_mode():
        full_grouped = backend.model(input_ids=sequence).logits
        backend.model.set_attn_implementation("sdpa")
        repeated = backend.generate(prompts, params)
        full_repeated = backend.model(input_ids=sequence).logits
    for a, b in zip(grouped, repeated):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    assert torch.equal(full_grouped, full_repeated)  # what the trainer recomputes is untouched


def test_models_without_grouped_heads_or_sdpa_keep_their_attention(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    assert not use_grouped_decode(eager) and eager.config._attn_implementation == "eager"
    config = eager.config
    config.num_key_value_heads = config.num_attention_heads
    plain = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    assert not use_grouped_decode(plain) and plain.config._attn_implementation == "sdpa"
