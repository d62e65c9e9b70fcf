"""Grammar masks for the torch sampler: one llguidance matcher per constrained row.

A row whose ``SamplingParams.grammar`` is set (``swarm.text.constraints`` builds it) gets a matcher
when it joins the loop; at every decode step the matcher's token bitmask sets the logits of every id
that cannot continue a valid reply to ``-inf`` (``mask_logits``), before the row's other rules, as
vLLM applies its grammar bitmask before its sampler. Everything after (penalties, temperature,
truncation, the ``log_softmax`` that is recorded) then sees only the allowed ids, so the recorded
log-prob of a constrained token is ``log_softmax`` over the allowed set: the distribution it was
drawn from. The sampled token then advances the matcher (``advance``). Once the grammar is complete
the mask allows only the end-of-turn ids, so the row ends with ``finish_reason`` "stop".

The llguidance tokenizer (every token's bytes) is built from the model's Hugging Face tokenizer on
the first constrained row (about a second for a 150k vocabulary), so a server that never constrains
never pays for it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import torch

__all__ = ["GrammarCompiler", "GrammarRow", "advance", "mask_logits"]

_BITS = torch.arange(8, dtype=torch.uint8)


class GrammarRow(Protocol):
    """What the mask reads of a running row: its matcher (None: unconstrained)."""

    matcher: Any


class GrammarCompiler:
    """Compiles row grammars against one tokenizer (llguidance's ``LLMatcher``)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Collection[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = sorted(eos_ids)
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for ``grammar``; ``ValueError`` with llguidance's message if it does not compile."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self._llg_tokenizer(), LLMatcher.grammar_from_lark(grammar), log_level=0)
        if matcher.is_error():
            raise ValueError(f"the constraint cannot be compiled: {matcher.get_error()}")
        return matcher

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                               eos_token=self._eos_ids)
            return self._tokenizer


def mask_logits(logits: torch.Tensor, rows: Sequence[GrammarRow], end_ids: Collection[int]) -> None:
    """In place on ``logits`` ``(B, V)``: each constrained row's disallowed ids get ``-inf``. A matcher
    in error (a token it could not take, which the mask itself prevents) allows only ``end_ids``, so
    the row ends instead of sampling from nothing."""
    vocab = logits.shape[-1]
    for k, row in enumerate(rows):
        if row.matcher is None:
            continue
        allowed = _allowed(row.matcher, vocab) if not row.matcher.is_error() else None
        if allowed is None or not bool(allowed.any()):
            allowed = torch.zeros(vocab, dtype=torch.bool)
            allowed[[t for t in end_ids if t < vocab]] = True
        logits[k].masked_fill_(~allowed.to(logits.device, non_blocking=True), float("-inf"))


def advance(row: GrammarRow, token: int) -> None:
    """Feed the sampled ``token`` to the row's matcher (a no-op for an unconstrained row)."""
    if row.matcher is not None and not row.matcher.is_stopped():
        row.matcher.consume_token(token)


def _allowed(matcher: Any, vocab: int) -> torch.Tensor:
    """Bool ``(vocab,)`` from the matcher's bitmask (bit ``i % 8`` of byte ``i // 8`` is id ``i``)."""
    packed = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) >> _BITS) & 1
    return bits.flatten()[:vocab].bool()
