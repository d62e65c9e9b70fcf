"""What the trainer's advantages are computed from: the posted rewards, or with ``random_reward`` a coin
flip per episode (the spurious-rewards control, arXiv 2506.10947: random rewards gave Qwen2.5-Math gains
and Llama-family models none, so a study can ask whether its model learns from the reward at all).

The flip is drawn from the episode id, not from a generator's state, so a step retried after a crash or
a restart trains on the same rewards; in deterministic mode from the episode's place in the work (task,
round, member: ``EpisodeRecord.coin_key``) instead, the same in every run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from swarm.server.records.episode import EpisodeRecord


def coin(episode_id: str, p: float) -> float:
    """1.0 with probability ``p``, else 0.0, the same for an episode id every time."""
    draw = int.from_bytes(hashlib.sha256(f"random_reward:{episode_id}".encode()).digest()[:8], "big") / 2**64
    return 1.0 if draw < p else 0.0


def training_rewards(episodes: Sequence[EpisodeRecord], random_reward: float) -> list[float]:
    """The rewards the trainer turns into advantages: each episode's posted one, or (``random_reward`` > 0)
    its coin flip."""
    if random_reward > 0:
        return [coin(e.coin_key or e.episode_id, random_reward) for e in episodes]
    return [float(e.reward or 0.0) for e in episodes]
