"""Asymmetric PPO clipping (DAPO's clip-higher): ``clip_ratio_low`` / ``clip_ratio_high`` reach verl's
loss on the torch trainer and verl's actor config on the verl trainer; ``clip_ratio`` stays the
symmetric shorthand for whichever bound is unset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm import algorithms
from swarm.backends.base import SamplingParams, TrainConfig, TrainSample


def _loss_grad(config: TrainConfig, ratio: float, advantage: float) -> tuple[float, float]:
    """The vanilla PPO loss's gradient with respect to one token's log-prob at probability ratio
    ``ratio`` (new / old), and the clip fraction verl reports for it."""
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), float(torch.log(torch.tensor(ratio))), requires_grad=True)
    mask = torch.ones(1, 1)
    info = {"dp_size": 1, "batch_num_tokens": 1.0, "global_batch_size": 1.0, "loss_scale_factor": 1}
    loss, metrics = algorithms.policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=logp, advantages=torch.full((1, 1), advantage), response_mask=mask,
        loss_agg_mode="token-mean", config=algorithms.actor_config(config, info), rollout_is_weights=None)
    loss.backward()
    assert logp.grad is not None
    return float(logp.grad), float(metrics["actor/pg_clipfrac"])


def test_clip_higher_lets_a_positive_advantage_ratio_go_further() -> None:
    symmetric = TrainConfig(clip_ratio=0.2)
    higher = TrainConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    # A token made 25% more likely with a positive advantage: clipped at 1.2, still pushed up below 1.28.
    assert _loss_grad(symmetric, 1.25, +1.0) == (0.0, 1.0)
    grad, clipped = _loss_grad(higher, 1.25, +1.0)
    assert grad == pytest.approx(-1.25) and clipped == 0.0  # d(-A * ratio)/d logp = -A * ratio
    # Past the wider bound it is clipped too.
    assert _loss_grad(higher, 1.3, +1.0) == (0.0, 1.0)
    # The lower bound is clip_ratio's still: a negative-advantage token made 25% less likely is clipped in both.
    assert _loss_grad(symmetric, 0.75, -1.0)[0] == 0.0 and _loss_grad(higher, 0.75, -1.0)[0] == 0.0
    # ... unless clip_ratio_low widens it.
    assert _loss_grad(TrainConfig(clip_ratio_low=0.3), 0.75, -1.0)[0] == pytest.approx(0.75)


def test_the_bounds_default_to_clip_ratio_and_are_validated() -> None:
    assert TrainConfig().clip_range() == (0.2, 0.2)
    assert TrainConfig(clip_ratio=0.1).clip_range() == (0.1, 0.1)
    assert TrainConfig(clip_ratio=0.1, clip_ratio_high=0.28).clip_range() == (0.1, 0.28)
    assert TrainConfig(clip_ratio_low=0.15, clip_ratio_high=0.3).clip_range() == (0.15, 0.3)
    for bad in ({"clip_ratio_low": 0.0}, {"clip_ratio_low": 1.0}, {"clip_ratio_high": -0.1}, {"clip_ratio_high": 11}):
        with pytest.raises(ValueError, match="clip_ratio_"):
            TrainConfig(**bad)


def test_the_torch_trainer_clips_with_the_wider_upper_bound(tiny_dir: Path) -> None:
    """Several PPO epochs on the same batch move ratios away from 1: with the upper bound out of reach
    fewer tokens are clipped than with a tight symmetric one (the same weights, samples and lr)."""
    from swarm.backends.torch import TorchBackend

    runs = {}
    for name, config in {"tight": TrainConfig(lr=5e-2, ppo_epochs=3, clip_ratio=0.02, rollout_is="off"),
                         "higher": TrainConfig(lr=5e-2, ppo_epochs=3, clip_ratio=0.02, clip_ratio_high=5.0,
                                               rollout_is="off")}.items():
        backend = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
        prompt = backend.render_prompt([{"role": "user", "content": "say a"}], None)
        gens = backend.generate([prompt] * 4, [SamplingParams(max_tokens=8, seed=i) for i in range(4)])
        samples = [TrainSample([*prompt, *g.token_ids], [0] * len(prompt) + [1] * len(g.token_ids),
                               [0.0] * len(prompt) + g.logprobs, advantage=1.0 if i % 2 else -1.0)
                   for i, g in enumerate(gens)]
        runs[name] = backend.train_step(samples, config)["train/pg_clipfrac"]
    assert runs["tight"] > runs["higher"] > 0  # the lower bound (negative advantages) still clips


def test_verl_gets_both_bounds() -> None:
    from swarm.backends.verl import knobs, verl_overrides

    config = TrainConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    knobs.check_supported(config)  # honoured, not refused as an unknown knob
    actor = knobs.actor_config(config, None)
    assert (actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2, 0.28)
    overrides = verl_overrides(config, "/models/qwen")
    assert "actor_rollout_ref.actor.clip_ratio_low=0.2" in overrides
    assert "actor_rollout_ref.actor.clip_ratio_high=0.28" in overrides
