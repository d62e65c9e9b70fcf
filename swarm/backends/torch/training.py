"""Policy-gradient and supervised updates on padded batches of ``TrainSample``.

Shapes follow verl's convention: for a right-padded batch ``tokens`` of shape ``(n, L)`` the model's
logits at position ``t`` score ``tokens[t + 1]``, so log-probs, the response mask (``loss_mask``
shifted by one) and recorded roll-out log-probs all have shape ``(n, L - 1)``.

Batches are cut into micro-batches by a token budget (rows sorted by length so padding stays
small). Every loss is aggregated with the *whole* batch's normalisers (token count, sequence count,
horizon), so gradients accumulated over micro-batches equal one big batch's gradient.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from swarm import algorithms
from swarm.backends.base import TrainConfig, TrainSample, validate_samples
from swarm.backends.torch.logprobs import token_logprobs
from swarm.mismatch import SOURCE_DIFF_PREFIX, worst_by_source

logger = logging.getLogger(__name__)

__all__ = ["Batch", "micro_batches", "pack", "policy_update", "sequence_logprobs", "supervised_update"]


@dataclass
class Batch:
    """A right-padded batch. ``mask``, ``rollout`` are shifted: index ``t`` scores ``tokens[t + 1]``."""

    tokens: torch.Tensor  # (n, L) long
    attention: torch.Tensor  # (n, L) long
    mask: torch.Tensor  # (n, L - 1) float
    rollout: torch.Tensor  # (n, L - 1) float
    advantages: torch.Tensor  # (n,) float
    temperatures: torch.Tensor  # (n,) float, 0 replaced by 1
    lengths: list[int]
    sources: list[str] = field(default_factory=list)  # per row: the pool member that sampled it ("": unknown)

    def select(self, rows: Sequence[int]) -> Batch:
        """The given rows, trimmed to their own longest length."""
        index = torch.tensor(list(rows), dtype=torch.long)
        width = max(self.lengths[i] for i in rows)
        return Batch(
            tokens=self.tokens[index, :width],
            attention=self.attention[index, :width],
            mask=self.mask[index, : width - 1],
            rollout=self.rollout[index, : width - 1],
            advantages=self.advantages[index],
            temperatures=self.temperatures[index],
            lengths=[self.lengths[i] for i in rows],
            sources=[self.sources[i] for i in rows] if self.sources else [],
        )


def pack(samples: Sequence[TrainSample], pad_id: int, vocab_size: int, max_context: int) -> Batch:
    """Validate and right-pad samples; ``ValueError`` on anything that cannot be trained."""
    validate_samples(samples, vocab_size, max_context)
    n, width = len(samples), max(len(s.tokens) for s in samples)
    tokens = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    rollout = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        k = len(s.tokens)
        tokens[i, :k] = torch.tensor(s.tokens, dtype=torch.long)
        attention[i, :k] = 1
        mask[i, :k] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rollout[i, :k] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    return Batch(
        tokens=tokens,
        attention=attention,
        mask=mask[:, 1:],
        rollout=rollout[:, 1:],
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        temperatures=torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in samples]),
        lengths=[len(s.tokens) for s in samples],
        sources=[s.source for s in samples],
    )


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row groups whose padded size (rows x longest row) fits ``budget`` (a lone row always fits)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        # Rows arrive longest first, so a group's width is its first row's length.
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def sequence_logprobs(
    model: torch.nn.Module, batch: Batch, vocab_size: int, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``tokens[:, 1:]`` under ``logits / T`` (shape ``(n, L - 1)``) and optionally entropy.

    Logits are cut to the first ``vocab_size`` ids (those the tokenizer knows), as in sampling, and
    computed chunk by chunk in bounded memory (``logprobs.token_logprobs``), on a large vocabulary only
    where ``batch.mask`` is 1 (0 elsewhere: every caller masks). No top-k/top-p/min-p or
    penalties enter here: rows sampled with them recorded other log-probs (see ``sampling``).
    """
    return token_logprobs(model, batch.tokens, batch.temperatures, vocab_size, with_entropy, only=batch.mask)


def _global_info(batch: Batch) -> dict[str, float | int]:
    return {
        "dp_size": 1,
        "batch_num_tokens": float(batch.mask.sum()),
        "global_batch_size": float((batch.mask.sum(-1) > 0).sum()),
        "loss_scale_factor": batch.mask.shape[-1],
    }


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None,
    batch: Batch,
    config: TrainConfig,
    vocab_size: int,
) -> dict[str, float]:
    """One clipped policy-gradient update (verl's loss ``config.policy_loss``); returns metrics.

    Score the batch under the frozen policies (old, for several PPO epochs; reference, for KL), then
    per epoch accumulate every micro-batch's gradient and take one optimizer step."""
    start = time.perf_counter()
    loss = _PolicyLoss(config, _global_info(batch), use_kl=config.kl_coef > 0 and reference is not None)
    parts = [batch.select(g) for g in micro_batches(batch.lengths, config.micro_batch_tokens)]
    model.train()
    old, ref = _frozen_logprobs(model, reference if loss.use_kl else None, parts, config.ppo_epochs > 1, vocab_size)
    tally = _Tally(total_tokens=loss.info["batch_num_tokens"])
    for epoch in range(config.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for part, old_logp, ref_logp in zip(parts, old, ref, strict=True):
            logp, entropy = sequence_logprobs(model, part, vocab_size, with_entropy=epoch == 0)
            loss.backward(part, logp, old_logp, ref_logp, tally, first_epoch=epoch == 0)
            if entropy is not None:
                tally.first_pass(part, logp, entropy)
        tally.sums["grad_norm"] += float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
        optimizer.step()
    model.eval()
    return tally.metrics(config, batch, use_kl=loss.use_kl, elapsed=time.perf_counter() - start)


def _frozen_logprobs(model: torch.nn.Module, reference: torch.nn.Module | None, parts: list[Batch], old: bool,
                     vocab_size: int) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Per micro-batch: the policy's log-probs before the update (needed from a second PPO epoch on)
    and the reference's (for the KL penalty); None where not needed."""
    with torch.no_grad():
        olds = [sequence_logprobs(model, part, vocab_size)[0] if old else None for part in parts]
        refs = [sequence_logprobs(reference, part, vocab_size)[0] if reference is not None else None
                for part in parts]
    return olds, refs


class _PolicyLoss:
    """verl's policy loss (by name) plus the optional KL penalty, on one micro-batch at a time."""

    def __init__(self, config: TrainConfig, info: dict[str, float | int], *, use_kl: bool) -> None:
        self.config = config
        self.info = info
        self.use_kl = use_kl
        self.loss_fn = algorithms.policy_loss_fn(config.policy_loss)
        self.actor = algorithms.actor_config(config, info)

    def backward(self, part: Batch, logp: torch.Tensor, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                 tally: _Tally, *, first_epoch: bool) -> None:
        config = self.config
        old_logp = old_logp if old_logp is not None else logp.detach()
        mask = part.mask.to(logp.device)
        advantages = part.advantages.to(logp.device).unsqueeze(-1) * mask
        weights = None
        if config.rollout_is != "off":
            weights, truncated = algorithms.rollout_is_weights(
                old_logp - part.rollout.to(logp.device), mask, config.rollout_is, config.rollout_is_threshold)
            if first_epoch:
                tally.add("is_weight", (weights * mask).sum())
                tally.add("is_truncated", (truncated * mask).sum())
        pg_loss, pg_metrics = self.loss_fn(old_log_prob=old_logp, log_prob=logp, advantages=advantages,
                                           response_mask=mask, loss_agg_mode=config.loss_agg_mode,
                                           config=self.actor, rollout_is_weights=weights)
        loss = pg_loss
        if self.use_kl:
            kl_mat = algorithms.kl_terms(logp, ref_logp, config.kl_penalty)
            loss = loss + config.kl_coef * algorithms.aggregate(kl_mat, mask, config.loss_agg_mode, self.info)
            tally.add("kl", (kl_mat.detach() * mask).sum())
        loss.backward()
        share = float(part.mask.sum()) / tally.total_tokens
        tally.sums["loss"] += float(loss.detach())
        tally.sums["pg_loss"] += float(pg_loss.detach())
        tally.sums["pg_clipfrac"] += share * float(pg_metrics.get("actor/pg_clipfrac", 0.0))
        tally.sums["ppo_kl"] += share * float(pg_metrics.get("actor/ppo_kl", 0.0))


@dataclass
class _Tally:
    """Token-weighted sums over the micro-batches of an update, turned into slash-keyed metrics."""

    total_tokens: float
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl", "logprob_diff", "grad_norm", "is_weight",
         "is_truncated"), 0.0))
    diff_max: float = 0.0  # the worst training-inference log-prob mismatch of a sampled token
    diff_by_source: dict[str, float] = field(default_factory=dict)  # the same, per pool member that sampled

    def add(self, key: str, token_sum: torch.Tensor) -> None:
        self.sums[key] += float(token_sum) / self.total_tokens

    def first_pass(self, part: Batch, logp: torch.Tensor, entropy: torch.Tensor) -> None:
        """Entropy and the rollout mismatch, measured once, before the weights move."""
        mask = part.mask.to(logp.device)
        self.add("entropy", (entropy * mask).sum())
        diff = (logp.detach() - part.rollout.to(logp.device)).abs() * mask
        self.add("logprob_diff", diff.sum())
        self.diff_max = max(self.diff_max, float(diff.max()))
        if part.sources:
            worst_by_source(self.diff_by_source, part.sources, diff.max(dim=1).values.tolist())

    def metrics(self, config: TrainConfig, batch: Batch, *, use_kl: bool, elapsed: float) -> dict[str, float]:
        sums, epochs = self.sums, config.ppo_epochs
        trained = float(sum(batch.lengths))
        metrics = {
            "train/loss": sums["loss"] / epochs,
            "train/pg_loss": sums["pg_loss"] / epochs,
            "train/pg_clipfrac": sums["pg_clipfrac"] / epochs,
            "train/ppo_kl": sums["ppo_kl"] / epochs,
            "train/grad_norm": sums["grad_norm"] / epochs,
            "train/entropy": sums["entropy"],
            "train/rollout_logprob_diff": sums["logprob_diff"],
            # Trainer vs generator log-probs of the sampled tokens (before the update): ~0 on-policy with
            # the same numerics; it grows with staleness and with engine mismatch (vLLM kernels, bf16).
            "rollout/logprob_diff_mean": sums["logprob_diff"],
            "rollout/logprob_diff_max": self.diff_max,
            "train/response_tokens": self.total_tokens,
            "train/samples": float(len(batch.lengths)),
            "perf/train_tokens": trained * epochs,
            "perf/train_s": elapsed,
            "perf/tokens_per_s": trained * epochs / elapsed if elapsed > 0 else 0.0,
        }
        if config.rollout_is != "off":
            metrics["train/rollout_is_weight_mean"] = sums["is_weight"]
            metrics["train/rollout_is_truncated"] = sums["is_truncated"]
        if use_kl:
            metrics["train/kl"] = sums["kl"] / epochs
        for source, worst in self.diff_by_source.items():  # per pool member (the server drains outliers)
            metrics[SOURCE_DIFF_PREFIX + source] = worst
        return metrics


def supervised_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, config: TrainConfig, vocab_size: int
) -> dict[str, float]:
    """Token-mean negative log-likelihood on the masked tokens (temperature 1); one optimizer step."""
    start = time.perf_counter()
    total_tokens = float(batch.mask.sum())
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for rows in micro_batches(batch.lengths, config.micro_batch_tokens):
        part = batch.select(rows)
        part.temperatures = torch.ones_like(part.temperatures)
        logp, _ = sequence_logprobs(model, part, vocab_size)
        loss = -(logp * part.mask.to(logp.device)).sum() / total_tokens
        loss.backward()
        loss_sum += float(loss.detach())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
    optimizer.step()
    model.eval()
    elapsed = time.perf_counter() - start
    trained = float(sum(batch.lengths))
    return {
        "sft/loss": loss_sum,
        "sft/grad_norm": grad_norm,
        "sft/tokens": total_tokens,
        "perf/train_tokens": trained,
        "perf/train_s": elapsed,
        "perf/tokens_per_s": trained / elapsed if elapsed > 0 else 0.0,
    }
