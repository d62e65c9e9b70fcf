"""Backends own the model: generation with exact tokens and log-probs, training steps, checkpoints.

The role contracts (``base``: ``Generator``, ``Trainer``, ``Sampler``, ``TrainConfig``) and their
adapters: the in-process torch model (``torch``), the vLLM generator (``vllm``) and the verl trainer
(``verl``). Heavy libraries (torch, transformers, verl, ray) are imported only inside them.
``load_backend`` builds the in-process model; which engines a process runs, from its settings, is
``swarm.local.roles.load_roles``.
"""

from swarm.backends.base import (
    Generation,
    Generator,
    InProcessModel,
    RowFeed,
    Sampler,
    SamplingParams,
    TokenSink,
    TrainConfig,
    Trainer,
    TrainSample,
)

__all__ = [
    "Generation",
    "Generator",
    "InProcessModel",
    "RowFeed",
    "Sampler",
    "SamplingParams",
    "TokenSink",
    "TrainConfig",
    "TrainSample",
    "Trainer",
    "load_backend",
]


def load_backend(model: str, config: TrainConfig, *, seed: int = 0, kind: str = "torch", device: str = "cpu",
                 dtype: str = "float32", decode_cache: str = "auto") -> InProcessModel:
    """Build the backend ``kind`` for ``model`` (any name ``swarm.models.resolve`` resolves) on ``device``
    (``cpu``, ``cuda:N``) in ``dtype`` (``float32``, ``bfloat16``)."""
    if kind == "torch":
        from swarm.backends.torch import TorchBackend

        return TorchBackend.from_model(model, config, seed=seed, device=device, dtype=dtype, decode_cache=decode_cache)
    raise ValueError(f"unknown backend {kind!r}; available: torch")
