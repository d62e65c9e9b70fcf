"""Counter-based sampling noise: each sampled token's uniform is a pure function of its key.

A shared random stream hands its draws out in the order rows ask for them, so what one row samples
depends on which other rows share its batch and in what order they arrived. Here a row carries a
64-bit *stream key* (``SamplingParams.noise_key``) instead, and the uniform for its token at
``position`` is ``uniform(key, position)``: splitmix64's output for the counter ``position + 1`` of
that stream (the counter is the state, so no draw depends on any earlier one). The sampler turns it
into a token by inverse CDF over the processed distribution it records the log-prob of
(``swarm.backends.torch.sampling``), so the token and its recorded log-prob stay consistent.

``sample_key`` fixes what a row's identity is. The swarm server (``swarm serve --deterministic``,
``swarm.server.episodes.completions``) keys every row of a training episode by:

- the server's ``seed``;
- the **task**: its ``task_id`` and its *round*, how many groups of that task id this server had
  started before this one (a task seen again in a later epoch draws fresh noise; the group id itself
  is the client's random label, so it is not part of the key);
- the **sample index**: the episode's index within its group (claim order), the number of the chat
  call inside the episode (0 for the first call of a multi-turn episode) and the choice index of a
  call with ``n > 1``;
- the request's own ``seed`` when it sends one (``None`` otherwise);

and ``position`` is the token's index in that call's completion (0 for the first sampled token).
Held-out (eval) episodes are keyed by ``("eval", task_id, call, [sample,] choice, seed)`` with no round,
so every round evaluates its problems with the same noise (a task's second and later samples in a round,
``swarm run --eval-samples``, each with their own); a call outside any episode by its prompt ids. Two
servers with the same seed therefore draw the same noise for the same task, sample and position, which
is what makes two runs (or two arms of a comparison) reproduce, or share noise, token for token.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["KeyedNoise", "sample_key", "splitmix64", "uniform"]

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (the golden ratio in 64 bits)


def splitmix64(z: int) -> int:
    """splitmix64's output mix (Steele, Lea and Flood 2014) of a 64-bit value: a bijection whose
    outputs pass BigCrush for consecutive inputs."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def uniform(key: int, position: int) -> float:
    """The uniform in ``[0, 1)`` (53 bits, a float64) for token ``position`` of the stream ``key``."""
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position}")
    return (splitmix64(key + (position + 1) * _GAMMA) >> 11) * 2.0**-53


@dataclass(frozen=True)
class KeyedNoise:
    """A server's keyed sampling noise: ``seed`` starts every row's key (``sample_key``);
    ``batch_invariant`` (``--deterministic``) decodes each keyed row alone, so a run reproduces bit for bit;
    without it (``--coupled``) rows share the batched forward, so two runs of the same seed share their noise
    (common random numbers for comparing arms) at the default's speed, though not bit for bit."""

    seed: int
    batch_invariant: bool = True


def sample_key(seed: int, *parts: str | int | None) -> int:
    """The 64-bit stream key of one row: a hash (blake2b) of the seed and the parts naming the row
    (see the module docstring for what the server passes). Equal arguments give equal keys on every
    machine and in every process (no ``hash()`` salt)."""
    text = "\x1f".join([repr(seed), *(repr(p) for p in parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
