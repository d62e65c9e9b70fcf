"""The model-side state of a running generation batch: KV cache, attention mask, positions.

Continuous batching needs three operations on it between decode steps: a forward pass over every
row's pending input, dropping rows that finished, and merging in rows that were just prefilled.
Rows are left-padded, so every row's newest token sits in the last column: a merge pads whichever
batch is narrower on the left (cache and mask alike), and columns no row uses any more are trimmed
off the left, so the width follows the longest live row rather than the batch's whole history.
Position ids count each row's own real tokens, so padding never shifts a row; padded keys are
masked out exactly (probability 0), so a row's numbers do not depend on its neighbours beyond
float rounding of the batched matmuls.

Merging needs plain per-layer key/value tensors (transformers' ``DynamicLayer``); caches of other
kinds (sliding windows, hybrid models) report ``can_merge = False`` and the sampler then lets new
rows start only once the running ones have drained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

import torch

from swarm.backends.torch.attention import reads_sdpa_mask

__all__ = ["RowTable", "RunningBatch"]


class RowTable(Protocol):
    """Per-row settings kept alongside the batch (the sampler's plan); sliced and joined with it."""

    def select(self, keep: torch.Tensor) -> Self: ...

    def cat(self, other: Self) -> Self: ...


P = TypeVar("P", bound=RowTable)


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask[i, width - len(prompt):] = 1
    return ids, mask


def _attention_mask(mask: torch.Tensor, queries: int, sdpa: bool) -> torch.Tensor:
    """The mask to hand the model: 2D, or for SDPA a ready 4D boolean mask.

    transformers rebuilds a 4D mask from the 2D one on every call, which costs more than the tiny
    model's own layers; a prepared mask is used as is. Padding queries attend to themselves so no
    attention row is empty (an empty row would give NaN that leaks through masked keys).
    """
    if not sdpa:
        return mask
    keys = mask.bool()[:, None, None, :]
    if queries == 1:
        return keys
    width = mask.shape[-1]
    causal = torch.ones((queries, width), dtype=torch.bool).tril(diagonal=width - queries)
    diagonal = torch.zeros_like(causal)
    diagonal[torch.arange(queries), torch.arange(width - queries, width)] = True
    return (causal[None, None] & keys) | diagonal[None, None]


def _plain_layers(cache: Any) -> bool:
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


@dataclass
class RunningBatch(Generic[P]):
    """Rows being generated together. ``active[slot]`` is the sampler's row index of batch slot ``slot``.

    ``inputs``/``positions`` are the next forward's input ids and position ids (the whole prompt
    before prefill, one pending token after); ``mask`` covers the cache plus those inputs.
    """

    cache: Any  # transformers DynamicCache
    mask: torch.Tensor  # (B, W) long, 1 where a real token is (or will be) in the cache
    inputs: torch.Tensor  # (B, Q) long
    positions: torch.Tensor  # (B, Q) long
    next_pos: torch.Tensor  # (B,) position id of the token after the inputs
    active: list[int]
    plan: P

    @classmethod
    def prefill(cls, model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int,
                active: list[int], plan: P) -> RunningBatch[P]:
        """A batch of new rows whose first forward will run their (left-padded) prompts."""
        from transformers import DynamicCache

        inputs, mask = _left_pad(prompts, pad_id)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return cls(DynamicCache(config=model.config), mask, inputs, positions, mask.sum(-1), active, plan)

    def __len__(self) -> int:
        return len(self.active)

    def forward(self, model: torch.nn.Module, vocab_size: int) -> torch.Tensor:
        """Run the pending inputs through the model; return next-token logits ``(B, vocab_size)``."""
        device = next(model.parameters()).device
        sdpa = reads_sdpa_mask(model.config)
        out = model(
            input_ids=self.inputs.to(device),
            attention_mask=_attention_mask(self.mask, self.inputs.shape[-1], sdpa).to(device),
            position_ids=self.positions.to(device),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :vocab_size].float()  # sampled on the model's device

    def keep(self, slots: list[int]) -> None:
        """Drop every slot not in ``slots`` (after a forward), and the columns nobody needs now."""
        if len(slots) == len(self.active):
            return
        keep = torch.tensor(slots, dtype=torch.long)
        self.cache.batch_select_indices(keep.to(self._device))
        self.mask, self.next_pos = self.mask[keep], self.next_pos[keep]
        self.plan = self.plan.select(keep.to(self._device))
        self.active = [self.active[s] for s in slots]
        used = self.mask.any(dim=0).nonzero()
        lead = int(used[0]) if len(used) else 0
        if lead > 0:
            self.mask = self.mask[:, lead:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, lead:]
                layer.values = layer.values[:, :, lead:]

    def release(self) -> None:
        """Every row finished (nothing to give back: the cache goes with the batch)."""

    def advance(self, tokens: Sequence[int]) -> None:
        """Make the sampled ``tokens`` (one per slot, after ``keep``) the next forward's inputs."""
        self.inputs = torch.tensor(list(tokens), dtype=torch.long).unsqueeze(-1)
        self.positions = self.next_pos.unsqueeze(-1).clone()
        self.mask = torch.cat([self.mask, torch.ones((len(self.active), 1), dtype=torch.long)], dim=-1)
        self.next_pos = self.next_pos + 1

    @property
    def can_merge(self) -> bool:
        return _plain_layers(self.cache)

    def merge(self, other: RunningBatch[P]) -> None:
        """Append ``other``'s rows (both batches advanced, each with one pending token per row).

        Each layer's keys and values are written once into one new tensor (its left padding zeroed),
        not padded and then concatenated: a merge costs one copy of the cache, as a decode step's own
        cache append does (three copies made merges 60% of a 30-layer model's generation time)."""
        if not (self.can_merge and other.can_merge):
            raise ValueError("only plain dynamic KV caches can be merged")
        width = max(self.mask.shape[-1], other.mask.shape[-1])
        self.mask = _stack_left_padded(self.mask, other.mask, width, -1)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = _stack_left_padded(mine.keys, theirs.keys, width - 1, -2)
            mine.values = _stack_left_padded(mine.values, theirs.values, width - 1, -2)
        self.inputs = torch.cat([self.inputs, other.inputs])
        self.positions = torch.cat([self.positions, other.positions])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.active = self.active + other.active
        self.plan = self.plan.cat(other.plan)

    @property
    def _device(self) -> torch.device:
        return self.cache.layers[0].keys.device


def _stack_left_padded(first: torch.Tensor, second: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``first`` and ``second`` stacked along dim 0, each right-aligned in ``width`` along ``dim`` with
    zeros on the left (masked columns: their values are never used). One allocation, one copy of each."""
    shape = list(first.shape)
    shape[0], shape[dim] = first.shape[0] + second.shape[0], width
    out = first.new_empty(shape)
    for rows, part in ((slice(0, first.shape[0]), first), (slice(first.shape[0], None), second)):
        target = out[rows]
        missing = width - part.shape[dim]
        if missing:
            target.narrow(dim, 0, missing).zero_()
        target.narrow(dim, missing, part.shape[dim]).copy_(part)
    return out
