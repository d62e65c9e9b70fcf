"""GRPO inside the backend alone learns a toy task from random initialisation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend

LETTERS = b"abcdefghijklmnopqrstuvwxyz"


def _letters_step(backend: TorchBackend, config: TrainConfig, rng: random.Random, step: int) -> float:
    """One iteration: 4 prompts x 8 samples, reward = fraction of 'a' among 16 sampled tokens."""
    prompts = [[rng.choice(LETTERS) for _ in range(8)] for _ in range(4)]
    rows = [p for p in prompts for _ in range(8)]
    gens = backend.generate(rows, [SamplingParams(max_tokens=16, temperature=1.0, seed=step * 100 + i) for i in range(len(rows))])
    rewards = [g.token_ids.count(ord("a")) / 16 for g in gens]
    groups = [str(i // 8) for i in range(len(rows))]
    advantages = backend.advantages(rewards, groups, config)
    samples = [
        TrainSample(p + g.token_ids, [0] * len(p) + [1] * len(g.token_ids), [0.0] * len(p) + g.logprobs, a)
        for p, g, a in zip(rows, gens, advantages)
    ]
    metrics = backend.train_step(samples, config)
    assert metrics["train/rollout_logprob_diff"] < 1e-3  # on-policy: sampling and training agree
    return sum(rewards) / len(rewards)


@pytest.mark.slow
def test_grpo_raises_reward_on_the_letters_toy(tiny_dir: Path) -> None:
    config = TrainConfig(lr=1e-3)
    backend = TorchBackend.from_model(str(tiny_dir), config, seed=0)
    rng = random.Random(0)
    history = [_letters_step(backend, config, rng, step) for step in range(40)]
    start, end = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert start < 0.05
    assert end > 0.3 and end > 5 * start, history
    assert backend.policy_version == 40
