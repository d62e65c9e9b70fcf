"""What verl 0.9.1 needs from us on every device, and the model settings each device trains with.

Device-independent (applied in the driver by ``prepare`` and in every Ray worker through
``worker_env``, which names a plugin module verl imports during ``import verl``):

- verl must see trl as unavailable: with trl >= 1.x installed, verl's model patching imports
  ``AutoModelForCausalLMWithValueHead``, which trl removed, and building the model fails;
- attention is ``sdpa`` unless ``flash_attn`` imports: verl defaults to ``flash_attention_2``, which
  nothing this project installs provides.

Per device: on CPU the project's CPU platform (``cpu_platform``: gloo, fp32); on CUDA verl's own
platform (NCCL) with bf16 compute parameters (``param_dtype``; master weights, gradient reductions
and buffers stay fp32).
"""

from __future__ import annotations

import importlib
from typing import Any

from swarm.backends.verl import cpu_platform
from swarm.backends.verl.trl_guard import TRL_USERS, hide_trl

# TRL_USERS and hide_trl live in trl_guard (cpu_platform needs them too); still importable from here.
__all__ = ["TRL_PLUGIN", "TRL_USERS", "attn_implementation", "hide_trl", "mixed_precision", "model_overrides",
           "prepare", "worker_env"]

TRL_PLUGIN = "swarm.backends.verl._trl_plugin"
_GPU_PRECISION = {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def attn_implementation() -> str:
    """``flash_attention_2`` when ``flash_attn`` imports here, else ``sdpa`` (runs everywhere)."""
    try:
        importlib.import_module("flash_attn")
    except Exception:  # a broken flash-attn build is as good as none
        return "sdpa"
    return "flash_attention_2"


def model_overrides(device: str) -> dict[str, Any]:
    """``HFModelConfig.override_config`` for ``device`` (the attention implementation)."""
    return {"attn_implementation": "sdpa" if device == "cpu" else attn_implementation()}


def mixed_precision(device: str) -> dict[str, str]:
    """``FSDPEngineConfig.mixed_precision``: fp32 throughout on CPU, bf16 compute params on GPU."""
    return dict(cpu_platform.MIXED_PRECISION if device == "cpu" else _GPU_PRECISION)


def prepare(device: str) -> None:
    """The driver's side: check the verl version, hide trl, and on CPU register the CPU platform."""
    cpu_platform.check_verl_version()
    if device == "cpu":
        cpu_platform.activate()
    else:
        hide_trl()


def worker_env(device: str) -> dict[str, str]:
    """Environment for verl's Ray workers on ``device`` (the plugin module applies the fixes there)."""
    if device == "cpu":
        return cpu_platform.worker_env()
    return {"VERL_USE_EXTERNAL_MODULES": TRL_PLUGIN, "TOKENIZERS_PARALLELISM": "false"}
