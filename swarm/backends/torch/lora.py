"""LoRA on the torch backend: peft adapters injected into the model that trains.

Design: ``peft.get_peft_model`` replaces the targeted ``nn.Linear`` layers of the transformers model
in place with LoRA layers (frozen ``base_layer`` + ``lora_A``/``lora_B``). The backend keeps using
the transformers model itself (``PeftModel.get_base_model()``), not the ``PeftModel`` wrapper, so the
trainer's log-prob recomputation (which reaches into ``model.base_model`` and the output head) runs
unchanged through the adapted layers. Only the adapter parameters require gradients, so only they get
optimizer state. Generation reads a plain copy of the model holding the merged weights, refreshed
after every update (the backend's ``serving``): one matmul a layer at every decoded token instead of
three. Merged and factored fp32 arithmetic differ only by rounding, so the recorded log-probs meet the
trainer's within the bound full fine-tuning meets. In bf16 the serving copy keeps the adapters
factored: a merged bf16 weight would round a small update away.

What leaves the backend is always plain weights: ``merged`` publishes ``W + alpha/r * B @ A`` under
the base names (``swarm.weights.lora``), and a checkpoint holds those merged weights as its loadable
Hugging Face folder plus the adapter itself in ``adapter/`` (peft's own format), which is what a
resume restores on top of the frozen base. The reference model for KL is a frozen copy like any other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm.backends.base import TrainConfig
from swarm.weights.lora import merge_lora

__all__ = ["ADAPTER_DIR", "LoraSettings", "apply", "load_adapter", "load_plain", "merged", "save_adapter", "trainable"]

ADAPTER_DIR = "adapter"  # a checkpoint's adapter folder (adapter_config.json + adapter_model.safetensors)
_ADAPTER = "default"  # peft's adapter name; the backend holds one


@dataclass(frozen=True)
class LoraSettings:
    """The adapter shape a model was built with (fixed for the model's life)."""

    rank: int
    alpha: int
    targets: str | tuple[str, ...]

    @classmethod
    def of(cls, config: TrainConfig | None) -> LoraSettings | None:
        """The settings ``config`` asks for; None when LoRA is off (``lora_rank`` 0)."""
        if config is None or config.lora_rank == 0:
            return None
        targets = config.lora_target_modules
        return cls(config.lora_rank, config.lora_alpha, targets if isinstance(targets, str) else tuple(targets))

    @property
    def scale(self) -> float:
        """What the adapter's product is multiplied by (peft's ``scaling``; no rsLoRA)."""
        return self.alpha / self.rank

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = self.targets if isinstance(self.targets, str) else list(self.targets)
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM")


def apply(model: torch.nn.Module, settings: LoraSettings) -> Any:
    """Inject adapters into ``model`` in place (B = 0: the policy is unchanged) and freeze the rest;
    returns the ``PeftModel`` (``.get_base_model()`` is ``model``). ``ValueError`` when the targets
    name no layer of this model."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, settings.peft_config())
    except ValueError as exc:
        raise ValueError(f"lora_target_modules {settings.targets!r} do not fit this model: {exc}") from None


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: every one for full fine-tuning, the adapters under LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def merged(model: torch.nn.Module, settings: LoraSettings) -> dict[str, torch.Tensor]:
    """The policy's plain weights by Hugging Face name (see ``swarm.weights.lora.merge_lora``); the
    model is not changed and its unadapted tensors are returned as they are (no copy)."""
    return merge_lora(model.state_dict(), settings.scale, adapter=_ADAPTER)


def load_plain(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Make ``model`` serve plain (merged) ``weights``: each adapted layer's base takes the weight and
    its ``lora_B`` is zeroed, so the adapters add nothing. For a LoRA backend that only generates
    (another trainer publishes); a trainer's own adapters would be reset by it."""
    own = model.state_dict()
    targets = {name: _own_name(name, own) for name in weights}
    unknown = sorted(name for name, target in targets.items() if target is None)[:5]
    if unknown:
        raise ValueError(f"published weights do not fit this model: unknown parameters {unknown}")
    with torch.no_grad():
        for name, tensor in weights.items():
            target = own[str(targets[name])]
            target.copy_(tensor.to(target.device, target.dtype))
        for name, tensor in own.items():
            if ".lora_B." in name:
                tensor.zero_()


def _own_name(name: str, own: Mapping[str, torch.Tensor]) -> str | None:
    if name in own:
        return name
    module, _, leaf = name.rpartition(".")
    adapted = f"{module}.base_layer.{leaf}"
    return adapted if adapted in own else None


def save_adapter(peft_model: Any, folder: Path) -> None:
    """The adapter in peft's format (``adapter/``: loadable by peft and by vLLM's LoRA support)."""
    peft_model.save_pretrained(folder / ADAPTER_DIR, safe_serialization=True)


def load_adapter(peft_model: Any, folder: Path, settings: LoraSettings) -> None:
    """Restore the adapter a checkpoint holds; ``ValueError`` when it is missing or has another shape."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    where = folder / ADAPTER_DIR
    config_file, weights_file = where / "adapter_config.json", where / "adapter_model.safetensors"
    if not (config_file.is_file() and weights_file.is_file()):
        raise ValueError(f"{folder} holds no LoRA adapter ({ADAPTER_DIR}/): it was saved without lora_rank; "
                         "resume it with lora_rank = 0")
    saved = json.loads(config_file.read_text())
    # peft writes "all-linear" resolved to module names, so the layers are compared by the tensors' keys.
    adapter = load_file(str(weights_file), device=str(next(peft_model.parameters()).device))
    expected = set(get_peft_model_state_dict(peft_model))
    if (saved.get("r"), saved.get("lora_alpha")) != (settings.rank, settings.alpha) or set(adapter) != expected:
        raise ValueError(f"{folder}: its adapter (r={saved.get('r')}, lora_alpha={saved.get('lora_alpha')}, "
                         f"target_modules={saved.get('target_modules')!r}) does not fit this model's (rank "
                         f"{settings.rank}, alpha {settings.alpha}, targets {settings.targets!r})")
    set_peft_model_state_dict(peft_model, adapter)
