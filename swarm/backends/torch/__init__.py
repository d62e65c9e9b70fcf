"""The embedded torch backend: a transformers causal LM with exact-token sampling and verl losses.

``TorchBackend.from_model("tiny" | PATH, config, seed=...)`` is what ``swarm.backends.load_backend``
calls; ``build_tiny`` writes the offline tiny preset as a normal Hugging Face folder.
"""

from swarm.backends.torch.backend import TorchBackend, resolve_model_folder
from swarm.backends.torch.tiny import build_tiny

__all__ = ["TorchBackend", "build_tiny", "resolve_model_folder"]
