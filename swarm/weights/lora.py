"""Merge-on-publish for LoRA: a peft-adapted state dict → the plain model's weights under its own names.

Why merged: every receiver (vLLM reloading a folder or joining an NCCL group, pool workers applying a
delta, the torch generator) takes a full state dict under the Hugging Face names, so publishing
``W + scale * B @ A`` for each adapted layer keeps one code path for every transport, and a receiver
never needs to know that the trainer uses adapters (vLLM's LoRA serving has its own limits: a
maximum rank, adapters registered by name, CPU support that lags the GPU's). The trainer's tensors are
never changed: merged layers are new tensors, every other one is passed through as it is.

Names (peft's ``LoraModel`` injection, optionally under ``PeftModel``'s ``base_model.model.``):
``<m>.base_layer.weight`` / ``.bias`` are the frozen layer, ``<m>.lora_A.<adapter>.weight``
``(r, in)`` and ``<m>.lora_B.<adapter>.weight`` ``(out, r)`` the adapter; the merged result is
``<m>.weight`` ``(out, in)`` and ``<m>.bias``, exactly what peft's ``merge_and_unload`` leaves.
Embedding adapters and DoRA (``lora_embedding_*``, ``lora_magnitude_vector``) are refused: their
merge differs and no swarm config asks for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["PEFT_PREFIX", "is_adapter_key", "merge_lora"]

PEFT_PREFIX = "base_model.model."  # what ``PeftModel`` puts before the wrapped model's own names
_BASE = ".base_layer."
_UNSUPPORTED = ("lora_embedding_", "lora_magnitude_vector")


def is_adapter_key(name: str) -> bool:
    """True for an adapter tensor (``lora_A``/``lora_B`` and peft's other adapter kinds)."""
    return ".lora_" in name or name.startswith("lora_")


def merge_lora(state: Mapping[str, torch.Tensor], scale: float, *, adapter: str = "default",
               fan_in_fan_out: bool = False) -> dict[str, torch.Tensor]:
    """The merged weights of ``state`` (see the module docstring), Hugging Face names.

    ``scale``: ``lora_alpha / r``. ``fan_in_fan_out``: the base layers store ``(in, out)`` (GPT-2's
    ``Conv1D``), so the delta is transposed, as peft does. A merged weight is computed in fp32 (as
    peft does for half-precision weights on the CPU) and cast back to the base weight's dtype.
    ``ValueError`` for an adapter this cannot merge, or a base layer without both halves of its adapter.
    """
    import torch

    names = {key.removeprefix(PEFT_PREFIX): key for key in state}
    out: dict[str, torch.Tensor] = {}
    for name, key in names.items():
        if any(kind in name for kind in _UNSUPPORTED):
            raise ValueError(f"cannot merge {name!r}: only linear-layer LoRA adapters merge on publish")
        if is_adapter_key(name):
            continue
        if _BASE not in name:
            out[name] = state[key]
            continue
        module, _, leaf = name.rpartition(_BASE)
        if leaf != "weight":
            out[f"{module}.{leaf}"] = state[key]
            continue
        a_key, b_key = names.get(f"{module}.lora_A.{adapter}.weight"), names.get(f"{module}.lora_B.{adapter}.weight")
        if a_key is None or b_key is None:
            raise ValueError(f"{module}: a base layer without adapter {adapter!r} (lora_A and lora_B)")
        weight = state[key]
        with torch.no_grad():  # the adapters may require gradients: no graph for a published copy
            delta = state[b_key].float() @ state[a_key].float()
            if fan_in_fan_out:
                delta = delta.T
            out[f"{module}.weight"] = (weight.float() + delta.to(weight.device) * scale).to(weight.dtype)
    return out
