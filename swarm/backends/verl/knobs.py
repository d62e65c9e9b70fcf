"""``TrainConfig`` → verl's configs for the verl trainer, and the check that every knob is honoured.

Each ``TrainConfig`` field keeps its name and meaning under ``--trainer verl``:

==================== ==========================================================================
lr, weight_decay     AdamW (verl ``FSDPOptimizerConfig``); live: set on the workers' optimizer
grad_clip            ``FSDPOptimizerConfig.clip_grad`` (verl clips the global FSDP grad norm)
adv_estimator        verl estimator by name, computed on the driver (same as the torch trainer)
norm_adv_by_std      GRPO std normalisation
policy_loss          ``ActorConfig.policy_loss.loss_mode`` → verl ``ppo_loss`` picks it by name
loss_agg_mode        ``ActorConfig.loss_agg_mode`` (global-batch normalisers, as the torch trainer)
clip_ratio           ``ActorConfig.clip_ratio`` (the symmetric shorthand)
clip_ratio_low/high  ``ActorConfig.clip_ratio_low`` / ``_high`` (``actor.clip_ratio_low/high``); unset: clip_ratio
recipe               nothing of its own: it sets norm_adv_by_std and loss_agg_mode (``swarm.backends.recipes``)
kl_coef, kl_penalty  ``ActorConfig.use_kl_loss`` / ``kl_loss_coef`` / ``kl_loss_type``; reference =
                     the policy frozen when KL is first asked for (as the torch trainer)
ppo_epochs           one ``train_batch`` (one optimizer step) per epoch on the same batch
micro_batch_tokens   ``max_token_len_per_gpu`` (dynamic micro-batches, padding-free tokens)
rollout_is(_thr.)    verl ``compute_rollout_correction_weights`` → ``rollout_is_weights``
temperature          per sample, from ``TrainSample.temperature`` (0 read as 1)
lora_rank            ``HFModelConfig.lora_rank`` (verl wraps the model with peft; 0 = off)
lora_alpha           ``HFModelConfig.lora_alpha``
lora_target_modules  ``HFModelConfig.target_modules``; the LoRA keys are fixed at start, exported merged
==================== ==========================================================================

A field added to ``TrainConfig`` later is refused by ``check_supported`` when set to anything but
its default, until this module maps it: a knob is never silently ignored.

``worker_config`` is the whole worker configuration for a device, resolved without starting
anything (so a CUDA configuration can be checked on a CPU machine): SDPA attention unless
flash-attn imports, fp32 on CPU and bf16 compute parameters on GPU (``compat``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarm.backends.base import TrainConfig

__all__ = ["HONOURED", "actor_config", "check_supported", "lora_settings", "loss_scale", "optimizer_settings",
           "worker_config"]

HONOURED = frozenset({
    "lr", "weight_decay", "grad_clip", "adv_estimator", "norm_adv_by_std", "policy_loss", "loss_agg_mode",
    "clip_ratio", "clip_ratio_low", "clip_ratio_high", "recipe", "kl_coef", "kl_penalty", "ppo_epochs",
    "micro_batch_tokens", "rollout_is", "rollout_is_threshold", "lora_rank", "lora_alpha", "lora_target_modules",
})
# verl's kl_penalty kinds that need only the sampled tokens' log-probs ("full" needs whole distributions).
_KL_KINDS = frozenset({"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"})


def check_supported(config: TrainConfig) -> None:
    """``ValueError`` naming the first knob the verl trainer cannot honour; usable at server start."""
    # Training knobs only: a server config adds engine knobs (batching, sampling) that are not ours.
    for name, field in type(config).training_fields().items():
        if name not in HONOURED and getattr(config, name) != field.get_default(call_default_factory=True):
            raise ValueError(f"TrainConfig.{name} is not supported by the verl trainer (leave it at its default)")
    from swarm.algorithms import check_estimator

    check_estimator(config.adv_estimator)
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if config.policy_loss not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"unknown policy_loss {config.policy_loss!r}; known: {sorted(POLICY_LOSS_REGISTRY)}")
    kind = config.kl_penalty.removesuffix("+")
    if kind not in _KL_KINDS:
        raise ValueError(f"kl_penalty {config.kl_penalty!r} is not supported by the verl trainer; "
                         f"known: {sorted(_KL_KINDS)} (optionally with '+')")


def optimizer_settings(config: TrainConfig) -> dict[str, float]:
    """The live optimizer knobs, as ``SwarmTrainingWorker.set_optimizer`` takes them."""
    return {"lr": config.lr, "weight_decay": config.weight_decay, "clip_grad": config.grad_clip}


def lora_settings(config: TrainConfig) -> dict[str, Any]:
    """verl's LoRA fields of ``HFModelConfig`` (``actor_rollout_ref.model.lora_rank`` etc. in verl's own
    trainer config); rank 0 is verl's "off". Fixed once the workers have built the model."""
    targets = config.lora_target_modules
    return {"lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha,
            "target_modules": targets if isinstance(targets, str) else list(targets)}


def loss_scale(config: TrainConfig, horizon: int) -> int | None:
    """The ``seq-mean-token-sum-norm`` scale: ``horizon`` (longest sequence - 1), the value the torch
    trainer uses, so both trainers agree in every aggregation mode; None (unused) for other modes."""
    return horizon if config.loss_agg_mode == "seq-mean-token-sum-norm" else None


def actor_config(config: TrainConfig, scale: int | None) -> Any:
    """verl ``ActorConfig`` for ``ppo_loss`` (``scale``: see ``loss_scale``)."""
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    low, high = config.clip_range()
    return ActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=config.clip_ratio,
        clip_ratio_low=low,
        clip_ratio_high=high,
        policy_loss=PolicyLossConfig(loss_mode=config.policy_loss),
        loss_agg_mode=config.loss_agg_mode,
        loss_scale_factor=scale,
        ppo_epochs=config.ppo_epochs,
        use_kl_loss=config.kl_coef > 0,
        kl_loss_coef=config.kl_coef,
        kl_loss_type=config.kl_penalty,
        use_torch_compile=False,
    )


def worker_config(folder: Path, config: TrainConfig, *, device: str, seed: int = 0) -> Any:
    """verl's ``TrainingWorkerConfig`` for the model in ``folder`` on ``device`` ("cpu" or "cuda")."""
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    from swarm.backends.verl import compat

    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=str(folder), load_tokenizer=False, override_config=compat.model_overrides(device),
                                   enable_gradient_checkpointing=False, use_remove_padding=True,
                                   **lora_settings(config)),
        engine_config=FSDPEngineConfig(
            strategy="fsdp2",
            forward_only=False,
            use_dynamic_bsz=True,
            max_token_len_per_gpu=config.micro_batch_tokens,
            infer_max_token_len_per_gpu=config.micro_batch_tokens,
            mixed_precision=compat.mixed_precision(device),
            use_torch_compile=False,
            seed=seed,
        ),
        optimizer_config=FSDPOptimizerConfig(lr=config.lr, weight_decay=config.weight_decay,
                                             clip_grad=config.grad_clip, lr_scheduler_type="constant"),
        checkpoint_config=None,
    )
