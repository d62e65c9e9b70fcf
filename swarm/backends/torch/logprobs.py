"""Per-token log-probs and entropy of a causal LM in bounded memory, for training.

The plain way — full logits ``(n, L, V)``, a ``log_softmax`` of the same size, autograd keeping
both for the backward pass — grows with the vocabulary: with Qwen's 151,936 ids a ~4k-token batch
took 8.4 GB in a server and 10 GB in ``tests/bench/bench_memory.py`` (1.0 GB chunked). Here the
model's base runs once to its final hidden states, and the output head runs on chunks of positions
inside a custom autograd function that saves only its inputs; the backward pass recomputes one
chunk's logits at a time. Peak extra memory is a few chunks of logits whatever the batch, for one
extra head matmul per chunk. A chunk runs the full computation's own operations
(``log_softmax(logits / T)``, gather, entropy ``-sum(p log p)``), so results equal it to float
rounding (~1e-6 here, gradients included).

Models whose logits are not just ``lm_head(hidden)`` (soft-capping, logit scaling) or that expose no
base/head split take the full path.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CHUNK_LOGITS", "token_logprobs"]

# Logit elements per chunk. 16M fp32 values are 64 MiB per buffer (a chunk's forward holds about
# three, its backward two, plus the head's weight gradient): ~110 positions of a 151,936-id
# vocabulary, wide enough matmuls that chunking costs no measurable time. Buffers must stay above
# glibc's largest mmap threshold (32 MiB): smaller ones come from the heap, which fragments under
# this pattern — 4M-element chunks reached a 7 GB peak RSS on the same batch where 16M stays under
# 1 GB. Small vocabularies fit a whole micro-batch in one chunk (the tiny preset's 384 ids: 43k
# positions), which takes the plain path. None: never chunk (kept for tests/bench/bench_memory.py).
CHUNK_LOGITS: int | None = 16 * 2**20

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def token_logprobs(model: torch.nn.Module, tokens: torch.Tensor, temperatures: torch.Tensor, vocab_size: int,
                   with_entropy: bool = False, only: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``tokens[:, 1:]`` under ``logits[:, :-1, :vocab_size] / T`` and optionally the
    entropy of that distribution (no gradient), both ``(n, L - 1)``.

    ``tokens``: ``(n, L)`` long, right-padded; ``temperatures``: ``(n,)``. Right padding only ever
    follows the real tokens, so a plain causal mask already hides it from every real position and
    SDPA can take its fused causal kernel (no padding mask). A batch whose logits fit in one chunk
    takes the plain path (same memory bound, no recomputation).

    ``only`` (``(n, L - 1)``, nonzero where needed): on the chunked path the output head runs at
    those positions alone and every other position reads 0. Training needs log-probs only where the
    loss mask is 1; an agent's prompt (a tool preamble, tool results) is most of a sample, so this
    skips most of the head's cost on a large vocabulary.
    """
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    temperatures = temperatures.to(device)
    n, length = tokens.shape
    split = _base_and_head(model)
    if CHUNK_LOGITS is None or split is None or n * (length - 1) * vocab_size <= CHUNK_LOGITS:
        return _full(model, tokens, temperatures, vocab_size, with_entropy)
    base, head = split
    hidden = base(input_ids=tokens, attention_mask=None).last_hidden_state[:, :-1]
    flat = hidden.reshape(n * (length - 1), hidden.shape[-1])
    targets = tokens[:, 1:].reshape(-1)
    temps = temperatures.float().repeat_interleave(length - 1)
    picked = only.to(device).reshape(-1).nonzero().squeeze(-1) if only is not None else None
    if picked is not None:
        flat, targets, temps = flat[picked], targets[picked], temps[picked]
    weight = head.weight[:vocab_size]
    bias = head.bias[:vocab_size] if head.bias is not None else None
    step = max(1, CHUNK_LOGITS // vocab_size)
    logps, entropies = [], []
    for start in range(0, len(flat), step):
        part = slice(start, start + step)
        logp, entropy = _ChunkLogprobs.apply(flat[part], weight, bias, targets[part], temps[part], with_entropy)
        logps.append(logp)
        entropies.append(entropy)
    logp = _spread(logps, picked, (n, length - 1), flat)
    return logp, (_spread(entropies, picked, (n, length - 1), flat) if with_entropy else None)


def _spread(parts: list[torch.Tensor], picked: torch.Tensor | None, shape: tuple[int, int],
            like: torch.Tensor) -> torch.Tensor:
    """The chunks' values laid out as ``shape``: at the ``picked`` flat positions (zeros elsewhere),
    or everywhere when nothing was picked out. Differentiable."""
    values = torch.cat(parts) if parts else like.new_zeros(0)
    if picked is None:
        return values.view(shape)
    return values.new_zeros(shape[0] * shape[1]).index_put((picked,), values).view(shape)


def _base_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """The model's decoder and its output head when logits are exactly ``head(decoder(ids))``."""
    base = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    if base is None or base is model or not isinstance(head, torch.nn.Linear):
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return base, head


def _full(model: torch.nn.Module, tokens: torch.Tensor, temperatures: torch.Tensor, vocab_size: int,
          with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain computation: full logits and ``log_softmax`` (memory grows with n x L x V)."""
    logits = model(input_ids=tokens, attention_mask=None).logits
    logits = logits[:, :-1, :vocab_size].float() / temperatures.view(-1, 1, 1)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _chunk_logp_all(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    temps: torch.Tensor) -> torch.Tensor:
    """``log_softmax(head(hidden) / T)`` ``(N, V)``, with the full path's operations and rounding."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float().div_(temps.unsqueeze(-1))
    return torch.log_softmax(logits, dim=-1)


class _ChunkLogprobs(torch.autograd.Function):
    """One chunk of positions: ``hidden (N, H)``, head ``weight (V, H)`` (+ ``bias (V,)``),
    ``targets (N,)``, ``temps (N,)`` -> ``logp (N,)`` and ``entropy (N,)`` or None.
    Saves only the inputs; the backward pass recomputes the chunk's log-probs."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temps: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        logp_all = _chunk_logp_all(hidden, weight, bias, temps)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp().mul_(logp_all)).sum(-1) if with_entropy else None
        ctx.save_for_backward(hidden, weight, bias, targets, temps)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, temps = ctx.saved_tensors
        # d logp / d logits = onehot(target) - softmax, then through the division by T.
        grad = _chunk_logp_all(hidden, weight, bias, temps).exp_().mul_(-grad_logp.unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1).to(grad.dtype))
        grad = grad.div_(temps.unsqueeze(-1)).to(weight.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None
