"""The embedded torch backend: a transformers causal LM with exact-token sampling and verl losses.

``TorchBackend.from_model("tiny" | PATH, config, seed=...)`` is what ``swarm.backends.load_backend``
calls; ``build_preset`` (``build_tiny``) writes an offline preset (``PRESETS``: tiny, tiny-bpe,
tiny-bpe-think) as a normal Hugging Face folder.
"""

from swarm.backends.torch.backend import TorchBackend, resolve_model_folder
from swarm.backends.torch.presets import PRESETS, build_preset, is_preset
from swarm.backends.torch.tiny import build_tiny

__all__ = ["PRESETS", "TorchBackend", "build_preset", "build_tiny", "is_preset", "resolve_model_folder"]
