"""Model presets: named models built offline from a seed into an ordinary Hugging Face folder.

- ``tiny``: byte-level tokenizer (one token per byte, every id sequence is canonical), the fast default;
- ``tiny-bpe``: Qwen2.5's real BPE tokenizer and chat template on a tiny random Qwen2 model;
- ``tiny-bpe-think``: the same with a Qwen3-style thinking template.

A preset is built once into ``artifacts/models/<preset>-<seed>`` (or a given folder) and loaded from
there like any other folder; a marker file with a format number makes stale builds rebuild. The
builders import torch and transformers only when a build runs, so resolving a model name imports
neither (and no engine: the engines import this package, not the other way round).
"""

from __future__ import annotations

from pathlib import Path

from swarm.models import tiny, tiny_bpe
from swarm.models.folders import build_once
from swarm.models.named import TINY_PRESETS

__all__ = ["PRESETS", "build_preset", "build_preset_once", "is_current_preset", "is_preset"]

PRESETS: tuple[str, ...] = TINY_PRESETS  # listed in swarm.models.named, which the researcher reads without torch


def is_preset(name: str) -> bool:
    """True if ``name`` names a preset rather than a model folder."""
    return name in PRESETS


def build_preset(name: str, directory: str | Path, seed: int = 0) -> Path:
    """Write preset ``name`` to ``directory`` and return it."""
    if name == "tiny":
        return tiny.build_tiny(directory, seed=seed)
    if name in tiny_bpe.BPE_PRESETS:
        return tiny_bpe.build_tiny_bpe(directory, preset=name, seed=seed)
    raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")


def is_current_preset(name: str, directory: str | Path, seed: int) -> bool:
    """True if ``directory`` holds a complete build of preset ``name`` in its current format and seed."""
    if name == "tiny":
        return tiny.is_current_tiny(directory, seed)
    return tiny_bpe.is_current_tiny_bpe(directory, name, seed)


def build_preset_once(name: str, folder: Path, seed: int) -> Path:
    """``folder`` holding a current build of preset ``name`` (``swarm.models.folders.build_once``)."""
    return build_once(folder, lambda built: is_current_preset(name, built, seed),
                      lambda staging: build_preset(name, staging, seed))
