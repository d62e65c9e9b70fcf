"""What the torch sampler does to one decode step's logits: vLLM's processors, in vLLM's order.

Per row (``SamplingParams``), on logits ``(B, V)`` over the tokenizer's ids:

0. ``grammar``: ids the row's grammar cannot take next get ``-inf`` (``swarm.backends.torch.grammar``;
   vLLM applies its grammar bitmask before its sampler too), so every later step sees the allowed set.
1. ``min_tokens``: while a row has fewer sampled tokens, its end-of-turn ids and its
   ``stop_token_ids`` get logit ``-inf`` (end-of-turn ids even with ``ignore_eos``, as vLLM masks its
   "all stop token ids" set including the model's eos). Then ``logit_bias``: each listed id's bias is
   added to its logit (vLLM's ``LogitBiasLogitsProcessor``, also before the penalties).
2. penalties on the raw logits: ``repetition_penalty`` ``r`` on every id in the prompt or the output
   (a positive logit is divided by ``r``, a negative one multiplied), then ``frequency_penalty`` times
   the id's count in the output and ``presence_penalty`` once per id in the output are subtracted
   (OpenAI's definition). Greedy rows take the argmax here.
3. temperature: ``logits / T`` (greedy rows: ``T = 1`` and no truncation, as vLLM resets their
   ``top_p``, ``top_k`` and ``min_p``).
4. ``min_p``: ids whose probability is below ``min_p`` times the row's top probability are dropped.
5. ``top_k``: ids below the k-th largest logit are dropped (ties with it stay).
6. ``top_p``: over what is left, renormalised, the least likely ids whose total mass is at most
   ``1 - top_p`` are dropped; the most likely id always stays.

The row samples from ``softmax`` over what is left, and ``log_softmax`` of the truncated logits
(``-inf`` for dropped ids) is its processed log-prob distribution: what is recorded for the sampled
token and what the top alternatives are ranked by — vLLM's ``--logprobs-mode processed_logprobs``
(vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py, vLLM 0.32). Alternatives that were
dropped carry ``LOGPROB_FLOOR``, the value vLLM's OpenAI server reports for ``-inf``.

Each step runs only when some row of the batch uses it (``Uses``), so a batch of plain rows pays
for exactly one ``log_softmax``, as before these extensions existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swarm.backends.base import SamplingParams

__all__ = ["LOGPROB_FLOOR", "RowHistory", "SamplingPlan", "apply_row_rules", "processed_logprobs", "top_p_dropped"]

LOGPROB_FLOOR = -9999.0


class RowHistory(Protocol):
    """What the row rules read of a running row."""

    prompt: Sequence[int]
    params: SamplingParams
    ids: list[int]


@dataclass(frozen=True)
class Uses:
    """Which steps some row of a batch needs (kept when rows leave: a stale True costs a no-op pass)."""

    greedy: bool = False
    seed: bool = False
    min_tokens: bool = False
    penalties: bool = False
    min_p: bool = False
    top_k: bool = False
    top_p: bool = False
    logit_bias: bool = False
    grammar: bool = False  # some row is constrained (``swarm.backends.torch.grammar``)

    @property
    def truncation(self) -> bool:
        return self.min_p or self.top_k or self.top_p

    @property
    def masking(self) -> bool:
        """Some row may have ids of probability 0 (truncated, held back by ``min_tokens`` or a grammar)."""
        return self.truncation or self.min_tokens or self.grammar

    def __or__(self, other: Uses) -> Uses:
        return Uses(*(a or b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def _penalised(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


@dataclass
class SamplingPlan:
    """Per-row sampling settings as ``(B,)`` tensors, built once per batch and sliced with it."""

    temperature: torch.Tensor  # float, greedy rows 1
    greedy: torch.Tensor  # bool
    top_p: torch.Tensor  # float, 1: off (and for greedy rows)
    top_k: torch.Tensor  # long, 0: off (and for greedy rows)
    min_p: torch.Tensor  # float, 0: off (and for greedy rows)
    alternatives: torch.Tensor  # long, top alternatives each row reports (0: none)
    max_alternatives: int  # the largest of ``alternatives``: 0 skips the topk altogether
    uses: Uses

    @classmethod
    def of(cls, params: Sequence[SamplingParams], seeded: Sequence[bool]) -> SamplingPlan:
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        greedy = temps == 0
        sampled = [p.temperature > 0 for p in params]
        top_p = [p.top_p if s else 1.0 for p, s in zip(params, sampled)]
        top_k = [p.top_k if s else 0 for p, s in zip(params, sampled)]
        min_p = [p.min_p if s else 0.0 for p, s in zip(params, sampled)]
        alternatives = torch.tensor([p.top_logprobs for p in params], dtype=torch.long)
        uses = Uses(
            greedy=bool(greedy.any()),
            seed=any(seeded),
            min_tokens=any(p.min_tokens > 0 for p in params),
            penalties=any(_penalised(p) for p in params),
            min_p=any(v > 0 for v in min_p),
            top_k=any(v > 0 for v in top_k),
            top_p=any(v < 1 for v in top_p),
            logit_bias=any(p.logit_bias for p in params),
            grammar=any(p.grammar is not None for p in params),
        )
        return cls(
            temperature=torch.where(greedy, torch.ones_like(temps), temps),
            greedy=greedy,
            top_p=torch.tensor(top_p, dtype=torch.float32),
            top_k=torch.tensor(top_k, dtype=torch.long),
            min_p=torch.tensor(min_p, dtype=torch.float32),
            alternatives=alternatives,
            max_alternatives=int(alternatives.max()) if len(params) else 0,
            uses=uses,
        )

    def to(self, device: torch.device) -> SamplingPlan:
        """The same plan with its tensors on ``device`` (where the logits are)."""
        if self.temperature.device == device:
            return self
        return SamplingPlan(self.temperature.to(device), self.greedy.to(device), self.top_p.to(device),
                            self.top_k.to(device), self.min_p.to(device), self.alternatives, self.max_alternatives,
                            self.uses)

    def select(self, keep: torch.Tensor) -> SamplingPlan:
        alternatives = self.alternatives[keep.cpu()]
        widest = int(alternatives.max()) if self.max_alternatives and len(alternatives) else 0
        return SamplingPlan(self.temperature[keep], self.greedy[keep], self.top_p[keep], self.top_k[keep],
                            self.min_p[keep], alternatives, widest, self.uses)

    def cat(self, other: SamplingPlan) -> SamplingPlan:
        return SamplingPlan(
            torch.cat([self.temperature, other.temperature]),
            torch.cat([self.greedy, other.greedy]),
            torch.cat([self.top_p, other.top_p]),
            torch.cat([self.top_k, other.top_k]),
            torch.cat([self.min_p, other.min_p]),
            torch.cat([self.alternatives, other.alternatives]),
            max(self.max_alternatives, other.max_alternatives),
            self.uses | other.uses,
        )


def apply_row_rules(logits: torch.Tensor, rows: Sequence[RowHistory], plan: SamplingPlan,
                    end_ids: Collection[int]) -> None:
    """Steps 1–2 in place on ``logits`` ``(B, V)`` (row ``k`` is ``rows[k]``); ``end_ids`` are the
    end-of-turn ids. Rows that use neither step are not touched."""
    vocab = logits.shape[-1]
    if plan.uses.min_tokens:
        for k, row in enumerate(rows):
            if len(row.ids) < row.params.min_tokens:
                banned = [t for t in {*end_ids, *row.params.stop_token_ids} if t < vocab]
                logits[k, banned] = float("-inf")
    if plan.uses.logit_bias:
        for k, row in enumerate(rows):
            if row.params.logit_bias:
                ids, biases = zip(*row.params.logit_bias, strict=True)
                logits[k, list(ids)] += torch.tensor(biases, dtype=logits.dtype, device=logits.device)
    if plan.uses.penalties:
        for k, row in enumerate(rows):
            if _penalised(row.params):
                _penalise(logits[k], row)


def _penalise(logits: torch.Tensor, row: RowHistory) -> None:
    """Step 2 on one row's logits ``(V,)``, touching only the ids the row has seen."""
    p = row.params
    output = torch.tensor(row.ids, dtype=torch.long, device=logits.device)
    if p.repetition_penalty != 1.0:
        seen = torch.cat([torch.tensor(list(row.prompt), dtype=torch.long, device=logits.device), output]).unique()
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and len(output):
        ids, counts = output.unique(return_counts=True)
        logits[ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty


def processed_logprobs(logits: torch.Tensor, plan: SamplingPlan) -> torch.Tensor:
    """Steps 3–6: the log-probs ``(B, V)`` of the distribution each row samples from (``-inf`` for
    dropped ids). Without truncation in the batch this is ``log_softmax(logits / T)``."""
    scaled = logits / plan.temperature.unsqueeze(-1)
    uses = plan.uses
    if uses.min_p:
        probs = torch.softmax(scaled, dim=-1)
        floor = plan.min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
        scaled = scaled.masked_fill(probs < floor, float("-inf"))
    if uses.top_k:
        scaled = _top_k_masked(scaled, plan.top_k)
    if uses.top_p:
        scaled = scaled.masked_fill(top_p_dropped(torch.softmax(scaled, dim=-1), plan.top_p), float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def _top_k_masked(scaled: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Drop ids below each row's k-th largest value; rows with ``top_k`` 0 (or >= V) keep all.
    Only the batch's largest k is ranked (no full sort)."""
    vocab = scaled.shape[-1]
    active = (top_k > 0) & (top_k < vocab)
    if not bool(active.any()):
        return scaled
    k = torch.where(active, top_k, torch.ones_like(top_k))
    kth = scaled.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1).unsqueeze(-1))
    kth = kth.masked_fill(~active.unsqueeze(-1), float("-inf"))
    return scaled.masked_fill(scaled < kth, float("-inf"))


def top_p_dropped(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Bool ``(B, V)``: ids outside each row's nucleus — those whose more likely ids already hold
    ``top_p`` of the mass (so the most likely id always stays)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # A rounded-up cumulative sum may reach 1 in the far tail: rows with top_p = 1 drop nothing.
    dropped = (before >= top_p.unsqueeze(-1)) & (top_p < 1).unsqueeze(-1)
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, order, dropped)
