"""Weights payloads: full and delta round trips are bit-exact, deltas are small when little changed,
and every way of feeding a payload the wrong bytes or the wrong base is a ShardError."""

from __future__ import annotations

import pytest
import torch

from swarm.weights.shards import ChunkInfo, Manifest, ShardError, decode, encode, verify_chunk


def _bits(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert _bits(got[name]) == _bits(tensor), f"{name} differs in its bits"


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-45])
    return {
        "model.embed_tokens.weight": torch.randn(64, 32, generator=gen),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 32, generator=gen).to(torch.bfloat16),
        "model.norm.weight": torch.cat([specials, torch.randn(26, generator=gen)]),
        "model.layers.0.self_attn.q_proj.bias":
            torch.cat([specials, torch.randn(10, generator=gen)]).to(torch.bfloat16),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }


def _nudged(weights: dict[str, torch.Tensor], fraction: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """A copy where ``fraction`` of each float tensor's elements changed (and a signed zero and a NaN payload)."""
    gen = torch.Generator().manual_seed(seed)
    out = {name: tensor.clone() for name, tensor in weights.items()}
    for _name, tensor in out.items():
        if tensor.is_floating_point():
            flat = tensor.view(-1)
            picked = torch.rand(flat.numel(), generator=gen) < fraction
            flat[picked] = flat[picked] + 0.5
    out["model.norm.weight"][0] = -0.0  # equal as a value, different bits
    bits = out["model.norm.weight"].view(torch.int32)
    bits[2] = bits[2] | 1  # another NaN
    return out


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 97])
def test_full_round_trip_is_bit_exact(chunk_bytes: int) -> None:
    weights = _weights()
    manifest, chunks = encode(3, weights, chunk_bytes=chunk_bytes)
    assert manifest.kind == "full" and manifest.version == 3 and manifest.base_version is None
    assert all(len(c) <= chunk_bytes for c in chunks) and sum(map(len, chunks)) == manifest.total_bytes
    assert [info.index for info in manifest.chunks] == list(range(len(chunks)))
    _assert_identical(decode(Manifest.model_validate_json(manifest.model_dump_json()), chunks), weights)


def test_delta_round_trip_is_bit_exact_and_leaves_the_base_alone() -> None:
    base = _weights()
    new = _nudged(base, 0.02)
    new["model.extra.weight"] = torch.randn(4, 4)  # a tensor the base lacks travels whole
    base_copy = {name: tensor.clone() for name, tensor in base.items()}
    manifest, chunks = encode(4, new, base=(3, base), chunk_bytes=256)
    assert manifest.kind == "delta" and manifest.base_version == 3
    _assert_identical(decode(manifest, chunks, base=base), new)
    _assert_identical(decode(manifest, chunks, base=(3, base)), new)
    _assert_identical(base, base_copy)


def test_delta_of_few_changes_is_much_smaller_than_a_snapshot() -> None:
    base = {"w": torch.randn(256, 256), "b": torch.randn(256, 256).to(torch.bfloat16)}
    new = {name: tensor.clone() for name, tensor in base.items()}
    new["w"].view(-1)[::200] += 1.0
    new["b"].view(-1)[::90] += 1.0
    full, _ = encode(2, new)
    delta, chunks = encode(2, new, base=(1, base))
    assert delta.total_bytes * 10 < full.total_bytes
    _assert_identical(decode(delta, chunks, base=base), new)
    unchanged, _ = encode(2, base, base=(1, base))
    assert unchanged.total_bytes < 1024  # only the header


def test_delta_where_everything_changed_costs_no_more_than_a_snapshot() -> None:
    base = {"w": torch.randn(128, 128)}
    new = {"w": base["w"] + 1e-3}
    full, _ = encode(2, new)
    delta, chunks = encode(2, new, base=(1, base))
    assert delta.total_bytes <= full.total_bytes + 256
    _assert_identical(decode(delta, chunks, base=base), new)


def test_a_corrupted_chunk_is_named() -> None:
    manifest, chunks = encode(1, _weights(), chunk_bytes=128)
    bad = list(chunks)
    bad[2] = bytes([bad[2][0] ^ 0x01]) + bad[2][1:]
    with pytest.raises(ShardError, match="chunk 2"):
        decode(manifest, bad)
    with pytest.raises(ShardError, match="chunk 1"):
        verify_chunk(manifest.chunks[1], chunks[1][:-1])
    verify_chunk(manifest.chunks[1], chunks[1])
    with pytest.raises(ShardError):
        decode(manifest, chunks[:-1])


def test_a_delta_refuses_a_missing_or_wrong_base() -> None:
    v1 = _weights()
    v2 = _nudged(v1, 0.05, seed=2)
    v3 = _nudged(v2, 0.05, seed=3)
    manifest, chunks = encode(3, v3, base=(2, v2))
    with pytest.raises(ShardError, match="base is needed"):
        decode(manifest, chunks)
    with pytest.raises(ShardError, match="does not match"):
        decode(manifest, chunks, base=v1)  # the weights of version 1, not 2
    with pytest.raises(ShardError, match="not over version 1"):
        decode(manifest, chunks, base=(1, v2))
    with pytest.raises(ShardError, match="does not fit"):
        decode(manifest, chunks, base={k: v for k, v in v2.items() if k != "step"})
    _assert_identical(decode(manifest, chunks, base=(2, v2)), v3)


def test_a_manifest_of_another_version_is_refused() -> None:
    manifest, chunks = encode(5, _weights())
    other = Manifest(version=6, base_version=None, chunks=manifest.chunks, total_bytes=manifest.total_bytes)
    with pytest.raises(ShardError, match="version 5"):
        decode(other, chunks)
    with pytest.raises(ValueError):
        ChunkInfo(index=0, size=1, sha256="not-a-hash")
