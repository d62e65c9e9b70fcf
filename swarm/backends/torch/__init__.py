"""The embedded torch backend: a transformers causal LM with exact-token sampling and verl losses.

``TorchBackend.from_model("tiny" | PATH, config, seed=...)`` is what ``swarm.backends.load_backend``
calls; the model it loads is resolved (a preset built, a GGUF file converted) by ``swarm.models``.
"""

from swarm.backends.torch.backend import TorchBackend

__all__ = ["TorchBackend"]
