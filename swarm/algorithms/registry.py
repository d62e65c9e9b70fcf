"""The link to verl's algorithm registries: advantage estimators, policy losses, KL penalties.

We do not re-implement RL maths: estimators and losses are looked up by name in
``verl.trainer.ppo.core_algos`` so a researcher can vary them by name and the numbers are the ones
verl users know. ``import verl`` pulls in Ray and costs seconds, so it happens on first use only.

Micro-batching stays exact because verl's ``agg_loss`` accepts the global batch's token and
sequence counts (``ActorConfig.global_batch_info``): each micro-batch's loss is already scaled by
its share of the whole batch, so the per-micro-batch losses sum to the single-batch loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "SUPPORTED_ESTIMATORS",
    "AdvantageSettings",
    "LossSettings",
    "actor_config",
    "aggregate",
    "check_estimator",
    "compute_advantages",
    "kl_terms",
    "policy_loss_fn",
    "rollout_is_weights",
]

# Outcome estimators that need only rewards, a mask and group ids. GAE needs a critic, REMAX a
# greedy baseline, the optimal-token baselines per-token actor statistics, GDPO several rewards.
SUPPORTED_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
)


class AdvantageSettings(Protocol):
    """What ``compute_advantages`` reads of a training configuration (``TrainConfig`` has it)."""

    @property
    def adv_estimator(self) -> str: ...
    @property
    def norm_adv_by_std(self) -> bool: ...


class LossSettings(Protocol):
    """What ``actor_config`` reads of a training configuration (``TrainConfig`` has it). Named by
    shape rather than imported, so the trainers' contracts (``swarm.backends``) sit above this package."""

    @property
    def clip_ratio(self) -> float: ...
    def clip_range(self) -> tuple[float, float]: ...
    @property
    def loss_agg_mode(self) -> str: ...
    @property
    def ppo_epochs(self) -> int: ...
    @property
    def kl_coef(self) -> float: ...
    @property
    def kl_penalty(self) -> str: ...


def _core_algos() -> ModuleType:
    from verl.trainer.ppo import core_algos

    return core_algos


def actor_config(config: LossSettings, global_batch_info: Mapping[str, float]) -> Any:
    """A verl ``ActorConfig`` carrying our hyper-parameters and the whole batch's sizes."""
    from verl.workers.config import ActorConfig

    low, high = config.clip_range()  # verl's losses read the two bounds (``cliprange_low/high``)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=config.clip_ratio,
        clip_ratio_low=low,
        clip_ratio_high=high,
        loss_agg_mode=config.loss_agg_mode,
        ppo_epochs=config.ppo_epochs,
        use_kl_loss=config.kl_coef > 0,
        kl_loss_coef=config.kl_coef,
        kl_loss_type=config.kl_penalty,
        global_batch_info=dict(global_batch_info),
    )


def policy_loss_fn(name: str) -> Callable[..., Any]:
    """verl's policy loss called ``name``; ``ValueError`` listing the known names otherwise."""
    registry = _core_algos().POLICY_LOSS_REGISTRY
    if name not in registry:
        raise ValueError(f"unknown policy_loss {name!r}; known: {sorted(registry)}")
    return registry[name]


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, global_batch_info: Mapping[str, float]) -> torch.Tensor:
    """verl's ``agg_loss`` with the whole batch's normalisers."""
    return _core_algos().agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **global_batch_info)


def kl_terms(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate to the reference (verl's ``kl_penalty``)."""
    return _core_algos().kl_penalty(log_prob, ref_log_prob, kind)


def check_estimator(name: str) -> None:
    """``ValueError`` listing the supported names unless ``name`` is one of them."""
    if name not in SUPPORTED_ESTIMATORS:
        raise ValueError(f"unknown or unsupported adv_estimator {name!r}; known: {list(SUPPORTED_ESTIMATORS)}")


def compute_advantages(rewards: Sequence[float], group_ids: Sequence[str], config: AdvantageSettings) -> list[float]:
    """One advantage per episode from verl's estimator ``config.adv_estimator``.

    Each episode is a length-1 "response" holding its reward, which is how verl treats outcome
    rewards (the reward sits on the last token); the scalar advantage is then broadcast by the
    trainer over the episode's generated tokens.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"got {len(rewards)} rewards but {len(group_ids)} group ids")
    if not all(np.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite")
    check_estimator(config.adv_estimator)
    if not rewards:
        return []
    from verl.trainer.config import AlgoConfig

    core = _core_algos()
    fn = core.get_adv_estimator_fn(config.adv_estimator)
    scores = torch.tensor([float(r) for r in rewards], dtype=torch.float32).unsqueeze(-1)
    mask = torch.ones_like(scores)
    index = np.array([str(g) for g in group_ids], dtype=object)
    if config.adv_estimator == "grpo":
        adv, _ = fn(
            token_level_rewards=scores,
            response_mask=mask,
            index=index,
            norm_adv_by_std_in_grpo=config.norm_adv_by_std,
        )
    else:
        algo = AlgoConfig(adv_estimator=config.adv_estimator, norm_adv_by_std_in_grpo=config.norm_adv_by_std)
        adv, _ = fn(token_level_rewards=scores, response_mask=mask, index=index, config=algo)
    return [float(x) for x in adv[:, -1].tolist()]


def rollout_is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str,
                       threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's truncated importance weights for ``log_ratio = log pi_train - log pi_rollout``
    (``level`` "token" or "sequence"), and a 0/1 tensor marking the tokens whose weight was truncated."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    weights, _ = compute_rollout_correction_weights(log_ratio, mask, rollout_is=level, rollout_is_threshold=threshold)
    raw = log_ratio if level == "token" else (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)
    return weights, (raw > math.log(threshold)).float()
