"""Batched sampling with exact token ids and log-probs.

One forward pass per step covers every row: prompts are left-padded, the attention mask and
position ids make padding invisible, and a KV cache carries the context. Rows finish on their own
(an end-of-turn token, ``max_tokens`` or a stop string); finished rows are dropped from the batch
so late steps only pay for rows still running.

Continuous batching: given a ``RowFeed``, the loop asks it for new rows between decode steps,
prefills them on their own and merges their cache into the running batch (``running``), and hands
each row to the feed the moment it finishes. A row that joins late samples exactly what it would
alone (same seed, same tokens; log-probs equal up to float rounding).

Joins are paced by the batch's size: a running batch of ``n`` rows asks the feed for new rows every
``n // JOIN_PACE_ROWS`` decode steps (every step below that many rows). Each join copies the whole KV
cache once, so with calls arriving one by one a large batch of a deep model would spend more time
merging than decoding; paced, the copies stay a small share and a new row waits a few steps at most.

Only ids the tokenizer knows are sampled (models pad their embedding past the tokenizer; the
trainer slices the logits the same way, so the recorded and recomputed log-probs agree).

Every row follows vLLM's sampling rules (``logits``: ``min_tokens`` masking, repetition, frequency
and presence penalties, temperature, ``min_p``, ``top_k``, ``top_p``, in that order). The recorded
log-prob is that of the distribution the token was actually drawn from: ``log_softmax`` of the
penalised logits over ``T``, with ``min_p``/``top_k``/``top_p`` applied and the kept ids
renormalised (vLLM's ``processed_logprobs``, so the torch and vLLM engines record the same number).
``T == 0`` samples the argmax of the penalised logits and records ``log_softmax`` of them at
``T = 1``. With none of these extensions (no truncation, no penalties) the recorded log-prob is
``log_softmax(logits / T)``, exactly what the trainer recomputes, so the first update's ratio is 1
on fresh samples. The trainer's recomputation knows nothing of truncation or penalties: rows that use
them record log-probs that differ from the trainer's, and ``TrainConfig.rollout_is`` weights the
loss by that ratio.

``top_logprobs = k`` reports, per sampled token, the k largest entries of that same processed
distribution (ids truncation dropped carry ``logits.LOGPROB_FLOOR``, as in vLLM's answers): when the
chosen token is the argmax it is the first alternative with the identical log-prob. Alternatives go
to ``on_token`` with their token. Rows that ask for none cost nothing: the ``topk`` runs only while
some row in the batch asks for alternatives.

End of a row: an end-of-turn id (unless ``ignore_eos``: then it is kept and sampling goes on) or
one of the row's ``stop_token_ids`` (kept in the ids, finish "stop"), ``max_tokens`` ("length") or
a stop string. Before ``min_tokens`` tokens the end-of-turn and stop ids cannot be sampled, and a
stop string counts only if it ends past the text of the first ``min_tokens`` tokens (vLLM's
detokenizer rule).

Each row with a ``seed`` draws from its own ``torch.Generator``, so its output does not depend on
which other rows share the batch (up to float rounding of the batched matmuls).

A row with a ``noise_key`` (``swarm serve --deterministic``) goes further: its uniforms come from
``swarm.backends.noise.uniform(noise_key, position)``, a pure function of its key and the token's
position in the completion, and (``batch_invariant``) it is prefilled and decoded in a batch of its own
(never merged, the growing cache even where slots are used). Its forward passes then have exactly the shapes and inputs
of the row generated alone, so its logits, tokens and log-probs are bitwise the same whatever else is
being generated (batch invariance by construction, where batched kernels would round differently by
batch size and padding). The price is one forward per such row per step instead of one per batch
(``tests/bench/bench_deterministic.py`` measures it). A keyed row that is not ``batch_invariant``
(``swarm serve --coupled``) joins the shared batch with its keyed uniforms: the same noise as in another
run, at the default's speed, its logits rounded by the batch it shares.

A row with a ``grammar`` (constrained decoding: ``tool_choice`` required or named, ``response_format``
json) gets an llguidance matcher when it joins; each step its disallowed ids are masked to ``-inf``
before every other rule, and the sampled token advances the matcher (``swarm.backends.torch.grammar``).
Its recorded log-probs are therefore ``log_softmax`` over the allowed set, after temperature and the
other processing: the distribution the token was drawn from. The trainer scores the unmasked policy,
so like truncation this is an off-policy gap that ``TrainConfig.rollout_is`` weights (the masked
log-prob is never below the unmasked one, so the weights are at most 1 and are never clipped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.backends import noise, sampling_params
from swarm.backends.base import FinishReason, Generation, RowFeed, SamplingParams, TokenSink
from swarm.backends.torch.grammar import GrammarCompiler, advance, mask_logits
from swarm.backends.torch.logits import LOGPROB_FLOOR, SamplingPlan, apply_row_rules, processed_logprobs
from swarm.backends.torch.running import RunningBatch
from swarm.backends.torch.slots import SlotBatch, SlotPool
from swarm.text import templates

logger = logging.getLogger(__name__)

__all__ = ["JOIN_PACE_ROWS", "SamplingSetup", "sample_batch", "validate_requests"]

_Batch = RunningBatch[SamplingPlan] | SlotBatch[SamplingPlan]
JOIN_PACE_ROWS = 8  # a batch of n rows takes new rows every n // 8 decode steps (see the module docstring)



@dataclass(frozen=True)
class SamplingSetup:
    """What the loop needs to know about the model and tokenizer."""

    eos_ids: frozenset[int]
    pad_id: int
    vocab_size: int  # ids the tokenizer can decode; padded embedding rows beyond it are never sampled
    max_context: int
    decode: Callable[[Sequence[int]], str]
    slots: SlotPool | None = None  # static-cache decoding (``slots``); None: the growing cache (``running``)
    grammars: GrammarCompiler | None = None  # constrained rows' matchers; None: a grammar is refused


@dataclass
class _Row:
    prompt: Sequence[int]
    params: SamplingParams
    generator: torch.Generator | None
    matcher: Any = None  # the row's grammar matcher (``swarm.backends.torch.grammar``); None: unconstrained
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # with params.top_logprobs > 0
    emitted: int = 0
    finish: FinishReason | None = None


def validate_requests(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], setup: SamplingSetup) -> None:
    """Raise ``ValueError`` for anything the loop cannot serve; nothing is generated then."""
    sampling_params.validate_requests(prompts, params, max_context=setup.max_context, vocab_size=setup.vocab_size)


@dataclass
class _Picked:
    """One decode step's choice for every row of the batch, in batch order."""

    tokens: list[int]
    logprobs: list[float]  # under the processed distribution (see the module docstring)
    top: list[list[tuple[int, float]]] | None  # per row its ``top_logprobs`` alternatives; None when no row asks


def _alternatives(logp: torch.Tensor, plan: SamplingPlan) -> list[list[tuple[int, float]]]:
    """Each row's most likely (id, log-prob), most likely first, from the batch's widest topk."""
    values, indices = logp.topk(plan.max_alternatives, dim=-1)
    values = values.clamp(min=LOGPROB_FLOOR)
    return [list(zip(ids[:k], lps[:k]))
            for ids, lps, k in zip(indices.tolist(), values.tolist(), plan.alternatives.tolist())]


def _uniforms(rows: Sequence[_Row], plan: SamplingPlan, default: torch.Generator) -> torch.Tensor:
    """One inverse-CDF uniform per row (float64): from the counter-based noise for a row with a
    ``noise_key``, its own generator for a row with a ``seed``, else the shared default generator."""
    keyed = [row.params.noise_key for row in rows]
    if None not in keyed:  # draws nothing from the shared stream
        return torch.tensor([noise.uniform(key, len(row.ids)) for key, row in zip(keyed, rows) if key is not None],
                            dtype=torch.float64)
    uniforms = torch.rand(len(rows), generator=default, dtype=torch.float64)
    if plan.uses.seed:
        for k, (key, row) in enumerate(zip(keyed, rows)):
            if key is not None:
                uniforms[k] = noise.uniform(key, len(row.ids))
            elif row.generator is not None:
                uniforms[k] = torch.rand(1, generator=row.generator, dtype=torch.float64)[0]
    return uniforms


def _alone(params: SamplingParams) -> bool:
    """Whether a row decodes in a batch of its own: a keyed, batch-invariant row (see the module docstring)."""
    return params.noise_key is not None and params.batch_invariant


def _pick_tokens(logits: torch.Tensor, rows: Sequence[_Row], plan: SamplingPlan, default: torch.Generator,
                 end_ids: frozenset[int]) -> _Picked:
    """Choose one token per row; return the tokens, their processed log-probs and any alternatives."""
    if plan.uses.grammar:
        mask_logits(logits, rows, end_ids)
    apply_row_rules(logits, rows, plan, end_ids)
    logp = processed_logprobs(logits, plan)
    probs = logp.exp()
    uniforms = _uniforms(rows, plan, default).to(logits.device, non_blocking=True)
    cdf = probs.double().cumsum(dim=-1)
    chosen = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True).flatten()
    chosen = chosen.clamp_(max=logits.shape[-1] - 1)  # u * total can round up to total
    if plan.uses.masking:  # ... and the last id may have probability 0: take the top one then
        chosen = torch.where(probs.gather(-1, chosen.unsqueeze(-1)).flatten() > 0, chosen, probs.argmax(dim=-1))
    if plan.uses.greedy:
        chosen = torch.where(plan.greedy, logits.argmax(dim=-1), chosen)
    token_logp = logp.gather(-1, chosen.unsqueeze(-1)).flatten()
    top = _alternatives(logp, plan) if plan.max_alternatives else None
    # One host sync per step: ids (exact in float64) and log-probs come back together.
    both = torch.stack([chosen.double(), token_logp.double()]).cpu()
    return _Picked([int(t) for t in both[0].tolist()], both[1].tolist(), top)


class _StopWatcher:
    """Stop-string handling for one row: detects hits, cuts ids, releases tokens that are safe."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode

    def check(self, row: _Row) -> bool:
        """After a new token: cut the row at a stop string if one appeared; True if it did.

        Before ``min_tokens`` tokens nothing is checked, and then only stop strings that end past the
        text of the first ``min_tokens`` tokens count (vLLM's rule)."""
        floor = row.params.min_tokens
        if len(row.ids) <= floor:
            return False
        after = len(self.decode(row.ids[:floor])) if floor else 0
        start = templates.find_stop(self.decode(row.ids), row.params.stop, after=after)
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
        safe = templates.safe_prefix_chars(self.decode(row.ids), row.params.stop)
        count = row.emitted
        while count < len(row.ids) and len(self.decode(row.ids[: count + 1])) <= safe:
            count += 1
        return count


def _emit(row: _Row, index: int, upto: int, on_token: TokenSink | None) -> None:
    if on_token is not None:
        for k in range(row.emitted, upto):
            on_token(index, row.ids[k], row.logprobs[k], row.top[k] if row.params.top_logprobs else None)
    row.emitted = max(row.emitted, upto)


def sample_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    setup: SamplingSetup,
    default_generator: torch.Generator,
    on_token: TokenSink | None = None,
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
                 on_token: TokenSink | None, feed: RowFeed | None) -> None:
        self.model, self.setup, self.default, self.on_token, self.feed = model, setup, default_generator, on_token, feed
        self.cancelled = feed.cancelled if feed is not None else None  # rows whose caller went away
        self.watcher = _StopWatcher(setup.decode)
        self.rows: dict[int, _Row] = {}
        self.next_index = 0
        self.steps_since_join = 0

    def run(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[Generation]:
        initial = [self._add(prompt, p) for prompt, p in zip(prompts, params)]
        results = {i: self.rows[i] for i in initial}  # kept to the end: these are returned
        running: _Batch | None = None  # the shared batch: rows without a noise key, merged as they join
        alone: list[_Batch] = []  # one batch per row with a noise key (see the module docstring)
        pending = initial
        with torch.inference_mode():
            while True:
                alone = [b for b in (self._step(batch) for batch in alone) if b is not None]
                keyed = [i for i in pending if _alone(self.rows[i].params)]
                shared = [i for i in pending if not _alone(self.rows[i].params)]
                for index in keyed:
                    if (batch := self._step(self._prefill([index], alone=True))) is not None:
                        alone.append(batch)
                joined = self._step(self._prefill(shared)) if shared else None
                if running is not None:
                    running = self._step(running)
                if running is None:
                    running = joined
                elif joined is not None:
                    _merge(running, joined)
                pending = self._admit(running, len(running or ()) + len(alone))
                if running is None and not alone and not pending:
                    break
        return [_generation(results[i]) for i in initial]

    def _add(self, prompt: Sequence[int], params: SamplingParams) -> int:
        matcher = self._matcher(params)  # raises before the row takes an index
        index = self.next_index
        self.next_index += 1
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        self.rows[index] = _Row(prompt=prompt, params=params, generator=generator, matcher=matcher)
        return index

    def _matcher(self, params: SamplingParams) -> Any:
        """The row's grammar matcher (None without a grammar); ``ValueError`` if it cannot be compiled."""
        if params.grammar is None:
            return None
        if self.setup.grammars is None:
            raise ValueError("this generator does not serve constrained decoding (grammar)")
        return self.setup.grammars.matcher(params.grammar)

    def _admit(self, running: _Batch | None, rows: int) -> list[int]:
        """Rows the feed offers now (none while a cache that cannot be merged is still running, nor
        between the paced joins of a batch of ``rows`` rows in all)."""
        if self.feed is None or (running is not None and not running.can_merge):
            return []
        if rows and self.steps_since_join < rows // JOIN_PACE_ROWS:
            self.steps_since_join += 1
            return []
        self.steps_since_join = 0
        admitted: list[int] = []
        for prompt, params in self.feed.admit():
            try:
                validate_requests([prompt], [params], self.setup)
                admitted.append(self._add(prompt, params))
            except ValueError as exc:
                index = self.next_index
                self.next_index += 1
                self.feed.rejected(index, exc)
        return admitted

    def _prefill(self, indices: list[int], alone: bool = False) -> _Batch:
        """A new batch of these rows (``alone``: one keyed row, in the growing cache, never merged)."""
        rows = [self.rows[i] for i in indices]
        prompts = [r.prompt for r in rows]
        plan = SamplingPlan.of([r.params for r in rows],
                               [r.generator is not None or r.params.noise_key is not None for r in rows])
        plan = plan.to(next(self.model.parameters()).device)
        if self.setup.slots is not None and not alone:
            return SlotBatch.prefill(self.setup.slots, prompts, self.setup.pad_id, indices, plan)
        return RunningBatch.prefill(self.model, prompts, self.setup.pad_id, indices, plan)

    def _step(self, batch: _Batch) -> _Batch | None:
        """One forward and one sampled token per row; finished rows leave. None once all left."""
        logits = batch.forward(self.model, self.setup.vocab_size)
        rows = [self.rows[i] for i in batch.active]
        picked = _pick_tokens(logits, rows, batch.plan, self.default, self.setup.eos_ids)
        tokens = picked.tokens
        keep_slots: list[int] = []
        for slot, (index, token, logp) in enumerate(zip(batch.active, tokens, picked.logprobs)):
            row = self.rows[index]
            row.ids.append(token)
            row.logprobs.append(logp)
            advance(row, token)
            if picked.top is not None and row.params.top_logprobs:
                row.top.append(picked.top[slot])
            ends_turn = token in self.setup.eos_ids and not row.params.ignore_eos
            if ends_turn or (row.params.stop_token_ids and token in row.params.stop_token_ids):
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
            batch.release()
            return None
        batch.keep(keep_slots)
        batch.advance([tokens[s] for s in keep_slots])
        return batch

    def _finished(self, index: int, row: _Row) -> None:
        if self.feed is not None:
            self.feed.finished(index, _generation(row))
        del self.rows[index]  # the loop's own copy; initial rows stay in ``run``'s results


def _merge(running: _Batch, joined: _Batch) -> None:
    """Append ``joined``'s rows to ``running``: both come from one ``_prefill``, so of one kind."""
    if isinstance(running, SlotBatch) and isinstance(joined, SlotBatch):
        running.merge(joined)
        return
    if isinstance(running, RunningBatch) and isinstance(joined, RunningBatch):
        running.merge(joined)
        return
    raise TypeError(f"cannot merge a {type(joined).__name__} into a {type(running).__name__}")


def _generation(row: _Row) -> Generation:
    return Generation(token_ids=row.ids, logprobs=row.logprobs, finish_reason=row.finish or "length",
                      top_logprobs=row.top if row.params.top_logprobs else None)
