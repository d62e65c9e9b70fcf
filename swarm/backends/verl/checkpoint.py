"""The verl trainer's checkpoint folder: a loadable Hugging Face folder plus training state.

Layout (written to a staging folder, then renamed into place, so a crash never leaves half a
checkpoint under the target name)::

    <dir>/config.json, generation_config.json, tokenizer files   copied from the model folder
    <dir>/model.safetensors      full weights, Hugging Face names
    <dir>/optimizer.pt           full (unsharded) optimizer state from torch.distributed.checkpoint,
                                 keyed by parameter name
    <dir>/reference.safetensors  KL reference weights, when the trainer has a reference
    <dir>/trainer_state.json     {"format": 1, "policy_version", "model_name", "workers"}

Full (not sharded) state makes a checkpoint independent of the worker count: saved with N workers,
loaded with M. With tied embeddings ``lm_head.weight`` is left out, as ``save_pretrained`` does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarm.models.folders import atomic_folder

__all__ = ["Checkpoint", "read_checkpoint", "write_checkpoint"]

FORMAT = 1
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
REFERENCE_FILE = "reference.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
_TIED = ("lm_head.weight", "model.embed_tokens.weight")


@dataclass
class Checkpoint:
    """What a checkpoint holds; ``meta`` is ``trainer_state.json``."""

    meta: dict[str, Any]
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    reference: dict[str, torch.Tensor] | None


def _for_disk(weights: Mapping[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    out = {k: v.contiguous() for k, v in weights.items()}
    if tied:
        out.pop(_TIED[0], None)
    return out


def _from_disk(weights: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    if tied and _TIED[0] not in weights and _TIED[1] in weights:
        weights[_TIED[0]] = weights[_TIED[1]]
    return weights


def write_checkpoint(directory: str | Path, model_folder: Path, checkpoint: Checkpoint, *, tied: bool) -> None:
    """Write ``checkpoint`` to ``directory`` atomically (replacing an older one there)."""
    from safetensors.torch import save_file

    with atomic_folder(directory) as staging:
        shutil.copytree(model_folder, staging,
                        ignore=lambda _, names: [n for n in names if n.endswith(_WEIGHT_SUFFIXES)])
        save_file(_for_disk(checkpoint.weights, tied), str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        if checkpoint.optimizer is not None:
            torch.save(checkpoint.optimizer, staging / OPTIMIZER_FILE)
        if checkpoint.reference is not None:
            save_file(_for_disk(checkpoint.reference, tied), str(staging / REFERENCE_FILE), metadata={"format": "pt"})
        (staging / STATE_FILE).write_text(json.dumps({"format": FORMAT, **checkpoint.meta}))


def read_checkpoint(directory: str | Path, *, tied: bool) -> Checkpoint:
    """Read what ``write_checkpoint`` wrote; ``ValueError`` if ``directory`` is not such a folder."""
    from safetensors.torch import load_file

    folder = Path(directory)
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise ValueError(f"{folder} is not a checkpoint written by VerlTrainer.save (no {STATE_FILE})")
    meta = json.loads(state_file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: checkpoint format {meta.get('format')!r}, expected {FORMAT}")
    optimizer = None
    if (folder / OPTIMIZER_FILE).is_file():
        optimizer = torch.load(folder / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    reference = None
    if (folder / REFERENCE_FILE).is_file():
        reference = _from_disk(load_file(str(folder / REFERENCE_FILE)), tied)
    return Checkpoint(meta=meta, weights=_from_disk(load_file(str(folder / WEIGHTS_FILE)), tied),
                      optimizer=optimizer, reference=reference)
