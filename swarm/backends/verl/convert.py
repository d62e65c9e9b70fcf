"""Episodes → verl ``DataProto``, and ``TrainConfig`` → verl Hydra overrides.

Layout (verl's agent-loop convention): ``prompts`` are the tokens before the first generated token,
left-padded; ``responses`` are everything after, right-padded, with ``response_mask`` 1 on generated
tokens and 0 on tool/user tokens and padding. Rewards go to ``rm_scores`` at the last response token;
the server's episode-level advantages are also provided (``advantages``, broadcast over the mask) so a
trainer may skip its own estimator; ``uid`` carries the GRPO group id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from swarm.backends.base import TrainConfig, TrainSample


def _split(sample: TrainSample) -> int:
    """Index of the first generated token: where the prompt ends and the response begins."""
    try:
        return sample.loss_mask.index(1)
    except ValueError:
        raise ValueError("a sample without generated tokens cannot be trained") from None


def samples_to_data_proto(
    samples: Sequence[TrainSample],
    rewards: Sequence[float],
    group_ids: Sequence[str],
    pad_token_id: int,
) -> Any:  # verl's DataProto (verl is read as Any)
    """Build a verl ``DataProto`` with the keys verl's PPO trainer reads (shapes ``[batch, length]``)."""
    from verl import DataProto  # lazy: importing verl imports ray (~8 s)

    if not (len(samples) == len(rewards) == len(group_ids)) or not samples:
        raise ValueError("samples, rewards and group_ids must be non-empty and of equal length")
    splits = [_split(s) for s in samples]
    prompt_len = max(splits)
    response_len = max(len(s.tokens) - k for s, k in zip(samples, splits, strict=True))
    batch = len(samples)

    prompts = torch.full((batch, prompt_len), pad_token_id, dtype=torch.long)
    responses = torch.full((batch, response_len), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((batch, prompt_len), dtype=torch.long)
    response_attn = torch.zeros((batch, response_len), dtype=torch.long)
    response_mask = torch.zeros((batch, response_len), dtype=torch.long)
    rollout_log_probs = torch.zeros((batch, response_len), dtype=torch.float32)
    rm_scores = torch.zeros((batch, response_len), dtype=torch.float32)
    advantages = torch.zeros((batch, response_len), dtype=torch.float32)

    for row, (sample, k) in enumerate(zip(samples, splits, strict=True)):
        head, tail = sample.tokens[:k], sample.tokens[k:]
        prompts[row, prompt_len - k:] = torch.tensor(head, dtype=torch.long)
        prompt_attn[row, prompt_len - k:] = 1
        n = len(tail)
        responses[row, :n] = torch.tensor(tail, dtype=torch.long)
        response_attn[row, :n] = 1
        response_mask[row, :n] = torch.tensor(sample.loss_mask[k:], dtype=torch.long)
        rollout_log_probs[row, :n] = torch.tensor(sample.rollout_logprobs[k:], dtype=torch.float32)
        rm_scores[row, n - 1] = float(rewards[row])
        advantages[row, :n] = sample.advantage * response_mask[row, :n].float()

    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0) * attention_mask
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "rollout_log_probs": rollout_log_probs,
            "rm_scores": rm_scores,
            "advantages": advantages,
        },
        non_tensors={"uid": np.array(list(group_ids), dtype=object)},
    )


def verl_overrides(config: TrainConfig, model_path: str, *, n_gpus: int = 1, rollout: str = "vllm") -> list[str]:
    """Hydra overrides for verl's ``ppo_trainer`` that reproduce ``config`` at scale."""
    actor = "actor_rollout_ref.actor"
    return [
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"trainer.n_gpus_per_node={n_gpus}",
        f"algorithm.adv_estimator={config.adv_estimator}",
        f"algorithm.norm_adv_by_std_in_grpo={config.norm_adv_by_std}",
        f"{actor}.optim.lr={config.lr}",
        f"{actor}.optim.weight_decay={config.weight_decay}",
        f"{actor}.optim.clip_grad={config.grad_clip}",
        f"{actor}.clip_ratio={config.clip_ratio}",
        f"{actor}.clip_ratio_low={config.clip_range()[0]}",
        f"{actor}.clip_ratio_high={config.clip_range()[1]}",
        f"{actor}.policy_loss.loss_mode={config.policy_loss}",
        f"{actor}.loss_agg_mode={config.loss_agg_mode}",
        f"{actor}.ppo_epochs={config.ppo_epochs}",
        f"{actor}.use_kl_loss={config.kl_coef > 0}",
        f"{actor}.kl_loss_coef={config.kl_coef}",
        f"{actor}.kl_loss_type={config.kl_penalty}",
        f"algorithm.rollout_correction.rollout_is={'null' if config.rollout_is == 'off' else config.rollout_is}",
        f"algorithm.rollout_correction.rollout_is_threshold={config.rollout_is_threshold}",
    ]
