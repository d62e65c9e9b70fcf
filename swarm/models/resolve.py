"""One resolver from a model name to the local Hugging Face folder every engine loads.

A model is named one of five ways:

- a tiny preset (``tiny``, ``tiny-bpe``, ``tiny-bpe-think``): random weights built in code from a
  seed into ``artifacts/models/<preset>-<seed>`` beside the run (seconds; ``swarm.models.presets``);
- a registry model (``smollm2-135m``): a GGUF file shipped inside an installed package, found with
  ``importlib.util.find_spec`` (the package is never imported) and converted once into the model cache;
- a path to a ``.gguf`` file: converted once into the model cache, keyed by the file's SHA-256 (a
  registry model is its file: both names share one conversion);
- a Hugging Face causal-LM folder: used as it is;
- a Hugging Face Hub name, ``org/name[@revision]`` (not an existing path): the snapshot folder in the
  hub cache, downloaded there first when online (``swarm.models.hub``).

The model cache is ``$SWARM_MODEL_CACHE``, else ``~/.cache/swarm/models`` (as Hugging Face's own
cache is found): one converted copy per machine, whatever folder a server starts in (the researcher
starts each run in its own). A conversion takes a file lock, writes a staging folder, puts a marker
(source, format, SHA-256) in last and renames the folder into place: two servers starting at once
convert once, a killed or failed conversion leaves nothing a reader would take, and a marker of an
older ``GGUF_FORMAT`` or another file rebuilds.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

from swarm.models.folders import build_once
from swarm.models.gguf import GGUF_FORMAT, convert_gguf, file_sha256
from swarm.models.hub import hub_snapshot, parse_hub_name
from swarm.models.named import REGISTRY_MODELS, TINY_PRESETS, RegistryModel, is_tiny_preset
from swarm.models.presets import build_preset_once

log = logging.getLogger(__name__)

__all__ = ["default_model_cache", "locate", "model_name", "resolve_model_folder"]

_MARKER = "swarm-model.json"


def model_name(model: str, folder: Path) -> str:
    """The name a server reports: the preset or registry name, a Hub name's repo id (as vLLM reports it:
    the revision is not part of it), a GGUF file's stem, else the folder's name."""
    if is_tiny_preset(model) or model in REGISTRY_MODELS:
        return model
    hub = parse_hub_name(model)
    if hub is not None:
        return hub.repo_id
    if model.endswith(".gguf"):
        return Path(model).stem
    return folder.resolve().name


def default_model_cache() -> Path:
    """``$SWARM_MODEL_CACHE`` or ``~/.cache/swarm/models``."""
    return Path(os.environ.get("SWARM_MODEL_CACHE") or Path.home() / ".cache" / "swarm" / "models")


def resolve_model_folder(model: str, seed: int = 0, cache_dir: str | Path | None = None,
                         hub_cache: str | Path | None = None) -> Path:
    """The local folder for ``model`` (see the module docstring), built, converted or downloaded if needed.

    ``cache_dir``: for a tiny preset the folder to build into; for a registry model or a GGUF file
    the cache root (default ``default_model_cache()``). ``hub_cache``: the hub cache a Hub name is
    found in (default huggingface_hub's: ``HF_HUB_CACHE``...). ``ValueError`` with the fix for a name
    that is none of the five, a missing package, a file that cannot be converted or a Hub model that
    is neither cached nor downloadable (``swarm.models.hub.HubModelMissing``)."""
    if is_tiny_preset(model):
        folder = Path(cache_dir) if cache_dir is not None else Path("artifacts/models") / f"{model}-{seed}"
        return build_preset_once(model, folder, seed)
    root = Path(cache_dir) if cache_dir is not None else default_model_cache()
    if model in REGISTRY_MODELS:
        return _converted(locate(REGISTRY_MODELS[model]), root)
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise ValueError(f"GGUF file {model} does not exist")
        return _converted(path, root)
    hub = parse_hub_name(model)  # None for an existing path: a local folder named like org/name wins
    if hub is not None:
        return hub_snapshot(hub, hub_cache)
    folder = Path(model)
    if not folder.is_dir():
        raise ValueError(f"model {model!r} is not a preset ({', '.join(TINY_PRESETS)}), a registry model "
                         f"({', '.join(REGISTRY_MODELS)}), a .gguf file, an existing local folder or a "
                         "Hugging Face Hub name (org/name[@revision])")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model folder {folder} has no config.json; expected a Hugging Face causal-LM folder")
    return folder


def locate(entry: RegistryModel) -> Path:
    """The GGUF file of an installed registry model; ``ValueError`` naming the install command if
    its package is missing."""
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"this model needs the {entry.package!r} package: {entry.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / entry.file
    if not path.is_file():
        raise ValueError(f"the {entry.package!r} package has no {entry.file}; reinstall it: {entry.install}")
    return path


def _converted(source: Path, root: Path) -> Path:
    """The cache folder holding ``source`` converted, ``root/<file stem>-<sha256[:12]>``: a registry
    model and the same file named by its path share one conversion."""
    sha = file_sha256(source)

    def convert(staging: Path) -> None:
        log.warning("converting %s into %s once (about a minute; later starts load the folder)", source, root)
        facts = convert_gguf(source, staging)
        marker = {"source": str(source), "sha256": sha, "format": GGUF_FORMAT, **facts}
        (staging / _MARKER).write_text(json.dumps(marker, indent=2))

    return build_once(root / f"{source.stem}-{sha[:12]}", lambda folder: _is_current(folder, sha), convert)


def _is_current(folder: Path, sha: str) -> bool:
    try:
        marker = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("sha256") == sha and marker.get("format") == GGUF_FORMAT
