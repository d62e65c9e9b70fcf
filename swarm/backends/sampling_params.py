"""What one prompt row asks of a generator (``SamplingParams``) and the checks every engine runs on a
request before anything is generated (``validate_requests``), with vLLM's ranges for its sampling
extensions. A leaf: the role contract (``swarm.backends.base``) and every engine build on it, and
it imports neither them nor the text rules (``swarm.text``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_TOP_LOGPROBS", "SamplingParams", "validate_requests"]

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one prompt row (one row per returned choice).

    The fields after ``top_logprobs`` are vLLM's sampling extensions with vLLM's meaning: ``top_k``
    (0: off), ``min_p`` (0: off), ``repetition_penalty`` (1: off; over prompt and output),
    ``presence_penalty``/``frequency_penalty`` (0: off; over output tokens), ``min_tokens`` (no
    end-of-turn or stop token before that many), ``ignore_eos`` (run to ``max_tokens``),
    ``stop_token_ids`` (extra ids that end the row, kept in its ids like the end-of-turn token); then
    OpenAI's ``logit_bias`` (added to the raw logits with ``min_tokens``' masking, before penalties:
    -100 bans an id).

    ``noise_key`` (not vLLM's): a 64-bit stream key; the row then draws each token's uniform from
    ``swarm.backends.noise.uniform(noise_key, position)`` instead of a random stream, and
    (``batch_invariant``, the default) decodes in a batch of its own, so it samples the same tokens
    whatever else is generated beside it (``swarm serve --deterministic``). With ``batch_invariant``
    False it shares the batched forward (``swarm serve --coupled``): the same noise at the default's speed,
    its logits rounded by the batch it shares. ``seed`` is unused by the sampler when a key is set.

    ``grammar`` (vLLM's ``structured_outputs.grammar``): an llguidance Lark grammar the row's text must
    match (``swarm.text.constraints`` builds it for ``tool_choice`` and ``response_format``). At each
    step only ids that can continue a match may be sampled; the recorded log-probs are those of that
    masked distribution.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # alternatives to report per sampled token (0: none)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), OpenAI's logit_bias
    noise_key: int | None = None  # counter-based noise (see above)
    batch_invariant: bool = True  # a keyed row decodes in a batch of its own (see above)
    grammar: str | None = None  # constrained decoding (see above); None: unconstrained


def validate_requests(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                      max_context: int, vocab_size: int) -> None:
    """``ValueError`` for anything that cannot be served; checked before anything is generated."""
    if len(prompts) != len(params):
        raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")
        if p.max_tokens < 1:
            raise ValueError(f"prompt {i}: max_tokens must be at least 1, got {p.max_tokens}")
        if not (p.temperature >= 0.0 and math.isfinite(p.temperature)):
            raise ValueError(f"prompt {i}: temperature must be a finite number >= 0, got {p.temperature}")
        if not (0.0 < p.top_p <= 1.0):
            raise ValueError(f"prompt {i}: top_p must be in (0, 1], got {p.top_p}")
        if any(s == "" for s in p.stop):
            raise ValueError(f"prompt {i}: stop strings must not be empty")
        if not (0 <= p.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"prompt {i}: top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {p.top_logprobs}")
        _validate_extensions(i, p, vocab_size)
        if p.noise_key is not None and not (0 <= p.noise_key < 2**64):
            raise ValueError(f"prompt {i}: noise_key must be a 64-bit unsigned integer, got {p.noise_key}")
        if p.grammar is not None and not p.grammar.strip():
            raise ValueError(f"prompt {i}: grammar must not be empty (None: unconstrained)")
        if len(prompt) + p.max_tokens > max_context:
            raise ValueError(
                f"prompt {i}: {len(prompt)} prompt tokens + max_tokens {p.max_tokens} exceed the "
                f"model's context of {max_context} tokens"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i}: token ids must lie in [0, {vocab_size})")


def _validate_extensions(i: int, p: SamplingParams, vocab_size: int) -> None:
    """vLLM's sampling extensions, with vLLM's ranges (``top_k`` -1 is mapped to 0 at the protocol)."""
    if p.top_k < 0:
        raise ValueError(f"prompt {i}: top_k must be >= 0 (0: off), got {p.top_k}")
    if not (0.0 <= p.min_p <= 1.0):
        raise ValueError(f"prompt {i}: min_p must be in [0, 1], got {p.min_p}")
    if not (0.0 < p.repetition_penalty < math.inf):
        raise ValueError(f"prompt {i}: repetition_penalty must be a finite number > 0, got {p.repetition_penalty}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if not (-2.0 <= value <= 2.0):
            raise ValueError(f"prompt {i}: {name} must be in [-2, 2], got {value}")
    if not (0 <= p.min_tokens <= p.max_tokens):
        raise ValueError(f"prompt {i}: min_tokens must be in [0, max_tokens={p.max_tokens}], got {p.min_tokens}")
    if any(not (0 <= t < vocab_size) for t in p.stop_token_ids):
        raise ValueError(f"prompt {i}: stop_token_ids must lie in [0, {vocab_size})")
    if any(not (0 <= t < vocab_size) for t, _ in p.logit_bias):
        raise ValueError(f"prompt {i}: logit_bias token ids must lie in [0, {vocab_size})")
    if any(not (-100.0 <= bias <= 100.0) for _, bias in p.logit_bias):
        raise ValueError(f"prompt {i}: logit_bias values must lie in [-100, 100]")
