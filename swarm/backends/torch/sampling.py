"""Batched sampling with exact token ids and log-probs.

One forward pass per step covers every row: prompts are left-padded, the attention mask and
position ids make padding invisible, and a KV cache carries the context. Rows finish on their own
(an end-of-turn token, ``max_tokens`` or a stop string); finished rows are dropped from the batch
so late steps only pay for rows still running.

Continuous batching: given a ``RowFeed``, the loop asks it for new rows between decode steps,
prefills them on their own and merges their cache into the running batch (``running``), and hands
each row to the feed the moment it finishes. A row that joins late samples exactly what it would
alone (same seed, same tokens; log-probs equal up to float rounding).

Only ids the tokenizer knows are sampled (models pad their embedding past the tokenizer; the
trainer slices the logits the same way, so the recorded and recomputed log-probs agree).
The recorded log-prob is ``log_softmax(logits / T)[token]`` without top-p renormalisation, which
is what the trainer recomputes (verl does the same), so the first update's ratio is exactly 1 on
fresh samples. ``T == 0`` samples greedily and records the log-prob under ``T = 1``.

``top_logprobs = k`` reports, per sampled token, the k largest entries of that same distribution
(``log_softmax(logits / T)`` before top-p, as vLLM's processed log-probs): when the chosen token is
the argmax it is the first alternative with the identical log-prob. Rows that ask for none cost
nothing: the ``topk`` runs only while some row in the batch asks for alternatives.

Each row with a ``seed`` draws from its own ``torch.Generator``, so its output does not depend on
which other rows share the batch (up to float rounding of the batched matmuls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from swarm.backends import text
from swarm.backends.base import Generation, RowFeed, SamplingParams, TokenCallback
from swarm.backends.torch.running import RunningBatch

logger = logging.getLogger(__name__)

__all__ = ["SamplingSetup", "sample_batch", "validate_requests"]



@dataclass(frozen=True)
class SamplingSetup:
    """What the loop needs to know about the model and tokenizer."""

    eos_ids: frozenset[int]
    pad_id: int
    vocab_size: int  # ids the tokenizer can decode; padded embedding rows beyond it are never sampled
    max_context: int
    decode: Callable[[Sequence[int]], str]


@dataclass
class _Row:
    prompt: Sequence[int]
    params: SamplingParams
    generator: torch.Generator | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # with params.top_logprobs > 0
    emitted: int = 0
    finish: str | None = None


def validate_requests(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], setup: SamplingSetup) -> None:
    """Raise ``ValueError`` for anything the loop cannot serve; nothing is generated then."""
    text.validate_requests(prompts, params, max_context=setup.max_context, vocab_size=setup.vocab_size)


def _top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tail outside each row's nucleus (the most likely token always stays)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(before >= top_p.unsqueeze(-1), 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


@dataclass
class _Plan:
    """Per-row sampling settings as tensors, built once per batch and sliced when rows finish."""

    temperature: torch.Tensor  # (B,), 0 replaced by 1 (greedy rows record log-probs at T = 1)
    greedy: torch.Tensor  # (B,) bool
    top_p: torch.Tensor  # (B,)
    top_k: torch.Tensor  # (B,) long, alternatives each row reports (0: none)
    max_top_k: int  # the largest of ``top_k``: 0 skips the topk altogether
    any_greedy: bool
    any_top_p: bool
    any_seed: bool

    @classmethod
    def of(cls, rows: Sequence[_Row]) -> _Plan:
        temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32)
        greedy = temps == 0
        top_k = torch.tensor([r.params.top_logprobs for r in rows], dtype=torch.long)
        return cls(
            temperature=torch.where(greedy, torch.ones_like(temps), temps),
            greedy=greedy,
            top_p=torch.tensor([r.params.top_p for r in rows], dtype=torch.float32),
            top_k=top_k,
            max_top_k=int(top_k.max()) if len(rows) else 0,
            any_greedy=bool(greedy.any()),
            any_top_p=any(r.params.top_p < 1 for r in rows),
            any_seed=any(r.generator is not None for r in rows),
        )

    def select(self, keep: torch.Tensor) -> _Plan:
        top_k = self.top_k[keep]
        max_top_k = int(top_k.max()) if self.max_top_k and len(top_k) else 0
        return _Plan(self.temperature[keep], self.greedy[keep], self.top_p[keep], top_k, max_top_k,
                     self.any_greedy, self.any_top_p, self.any_seed)

    def cat(self, other: _Plan) -> _Plan:
        return _Plan(
            torch.cat([self.temperature, other.temperature]),
            torch.cat([self.greedy, other.greedy]),
            torch.cat([self.top_p, other.top_p]),
            torch.cat([self.top_k, other.top_k]),
            max(self.max_top_k, other.max_top_k),
            self.any_greedy or other.any_greedy,
            self.any_top_p or other.any_top_p,
            self.any_seed or other.any_seed,
        )


@dataclass
class _Picked:
    """One decode step's choice for every row of the batch, in batch order."""

    tokens: list[int]
    logprobs: list[float]  # under ``logits / T`` (see the module docstring)
    top: list[list[tuple[int, float]]] | None  # per row its ``top_k`` alternatives; None when no row asks


def _alternatives(logp: torch.Tensor, plan: _Plan) -> list[list[tuple[int, float]]]:
    """Each row's ``top_k`` most likely (id, log-prob), most likely first, from the batch's widest topk."""
    values, indices = logp.topk(plan.max_top_k, dim=-1)
    return [list(zip(ids[:k], lps[:k])) for ids, lps, k in zip(indices.tolist(), values.tolist(), plan.top_k.tolist())]


def _pick_tokens(logits: torch.Tensor, rows: Sequence[_Row], plan: _Plan, default: torch.Generator) -> _Picked:
    """Choose one token per row; return the tokens, their log-probs under ``logits / T`` and any alternatives."""
    logp = torch.log_softmax(logits / plan.temperature.unsqueeze(-1), dim=-1)
    probs = logp.exp()
    if plan.any_top_p:
        probs = _top_p_filter(probs, plan.top_p)
    # Inverse-CDF draws: one uniform per row, from the row's own generator when it has a seed.
    uniforms = torch.rand(len(rows), generator=default, dtype=torch.float64)
    if plan.any_seed:
        for k, row in enumerate(rows):
            if row.generator is not None:
                uniforms[k] = torch.rand(1, generator=row.generator, dtype=torch.float64)[0]
    cdf = probs.double().cumsum(dim=-1)
    chosen = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True).flatten()
    chosen = chosen.clamp_(max=logits.shape[-1] - 1)  # u * total can round up to total
    if plan.any_greedy:
        chosen = torch.where(plan.greedy, logits.argmax(dim=-1), chosen)
    token_logp = logp.gather(-1, chosen.unsqueeze(-1)).flatten()
    top = _alternatives(logp, plan) if plan.max_top_k else None
    return _Picked(chosen.tolist(), token_logp.tolist(), top)


class _StopWatcher:
    """Stop-string handling for one row: detects hits, cuts ids, releases tokens that are safe."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode

    def check(self, row: _Row) -> bool:
        """After a new token: cut the row at a stop string if one appeared; True if it did."""
        start = text.find_stop(self.decode(row.ids), row.params.stop)
        if start < 0:
            return False
        keep = len(row.ids) - 1
        while keep > 0 and len(self.decode(row.ids[:keep])) > start:
            keep -= 1
        del row.ids[keep:]
        del row.logprobs[keep:]
        del row.top[keep:]
        row.finish = "stop"
        return True

    def releasable(self, row: _Row) -> int:
        """How many of the row's tokens can be streamed without risk of being cut later."""
        safe = text.safe_prefix_chars(self.decode(row.ids), row.params.stop)
        count = row.emitted
        while count < len(row.ids) and len(self.decode(row.ids[: count + 1])) <= safe:
            count += 1
        return count


def _emit(row: _Row, index: int, upto: int, on_token: TokenCallback | None) -> None:
    if on_token is not None:
        for k in range(row.emitted, upto):
            on_token(index, row.ids[k], row.logprobs[k])
    row.emitted = max(row.emitted, upto)


def sample_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    setup: SamplingSetup,
    default_generator: torch.Generator,
    on_token: TokenCallback | None = None,
    feed: RowFeed | None = None,
) -> list[Generation]:
    """Generate one continuation per prompt; see the module docstring for the exact semantics.

    With a ``feed``, rows it admits join between decode steps and every finished row is handed to
    ``feed.finished`` at once; the call returns when no row runs and the feed admits nothing more.
    """
    validate_requests(prompts, params, setup)
    loop = _Loop(model, setup, default_generator, on_token, feed)
    return loop.run(prompts, params)


class _Loop:
    """One ``sample_batch`` call: the rows by index, and the running batch they share."""

    def __init__(self, model: torch.nn.Module, setup: SamplingSetup, default_generator: torch.Generator,
                 on_token: TokenCallback | None, feed: RowFeed | None) -> None:
        self.model, self.setup, self.default, self.on_token, self.feed = model, setup, default_generator, on_token, feed
        self.cancelled = getattr(feed, "cancelled", None)  # optional RowFeed hook: rows whose caller went away
        self.watcher = _StopWatcher(setup.decode)
        self.rows: dict[int, _Row] = {}
        self.next_index = 0

    def run(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[Generation]:
        initial = [self._add(prompt, p) for prompt, p in zip(prompts, params)]
        results = {i: self.rows[i] for i in initial}  # kept to the end: these are returned
        running: RunningBatch[_Plan] | None = None
        pending = initial
        with torch.inference_mode():
            while True:
                joined = self._step(self._prefill(pending)) if pending else None
                if running is not None:
                    running = self._step(running)
                if running is None:
                    running = joined
                elif joined is not None:
                    running.merge(joined)
                pending = self._admit(running)
                if running is None and not pending:
                    break
        return [_generation(results[i]) for i in initial]

    def _add(self, prompt: Sequence[int], params: SamplingParams) -> int:
        index = self.next_index
        self.next_index += 1
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        self.rows[index] = _Row(prompt=prompt, params=params, generator=generator)
        return index

    def _admit(self, running: RunningBatch[_Plan] | None) -> list[int]:
        """Rows the feed offers now (none while a cache that cannot be merged is still running)."""
        if self.feed is None or (running is not None and not running.can_merge):
            return []
        admitted: list[int] = []
        for prompt, params in self.feed.admit():
            try:
                validate_requests([prompt], [params], self.setup)
            except ValueError as exc:
                index = self.next_index
                self.next_index += 1
                self.feed.rejected(index, exc)
                continue
            admitted.append(self._add(prompt, params))
        return admitted

    def _prefill(self, indices: list[int]) -> RunningBatch[_Plan]:
        rows = [self.rows[i] for i in indices]
        return RunningBatch.prefill(self.model, [r.prompt for r in rows], self.setup.pad_id, indices, _Plan.of(rows))

    def _step(self, batch: RunningBatch[_Plan]) -> RunningBatch[_Plan] | None:
        """One forward and one sampled token per row; finished rows leave. None once all left."""
        logits = batch.forward(self.model, self.setup.vocab_size)
        picked = _pick_tokens(logits, [self.rows[i] for i in batch.active], batch.plan, self.default)
        tokens = picked.tokens
        keep_slots: list[int] = []
        for slot, (index, token, logp) in enumerate(zip(batch.active, tokens, picked.logprobs)):
            row = self.rows[index]
            row.ids.append(token)
            row.logprobs.append(logp)
            if picked.top is not None and row.params.top_logprobs:
                row.top.append(picked.top[slot])
            if token in self.setup.eos_ids:
                row.finish = "stop"
            elif row.params.stop and self.watcher.check(row):
                pass
            elif len(row.ids) >= row.params.max_tokens:
                row.finish = "length"
            elif self.cancelled is not None and self.cancelled(index):
                row.finish = "length"  # stops now, freeing its slot; the feed discards it
            if row.finish is not None or not row.params.stop:
                _emit(row, index, len(row.ids), self.on_token)
            else:
                _emit(row, index, self.watcher.releasable(row), self.on_token)
            if row.finish is None:
                keep_slots.append(slot)
            else:
                self._finished(index, row)
        if not keep_slots:
            return None
        batch.keep(keep_slots)
        batch.advance([tokens[s] for s in keep_slots])
        return batch

    def _finished(self, index: int, row: _Row) -> None:
        if self.feed is not None:
            self.feed.finished(index, _generation(row))
        del self.rows[index]  # the loop's own copy; initial rows stay in ``run``'s results


def _generation(row: _Row) -> Generation:
    return Generation(token_ids=row.ids, logprobs=row.logprobs, finish_reason=row.finish or "length",
                      top_logprobs=row.top if row.params.top_logprobs else None)
