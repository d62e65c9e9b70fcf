"""Backends own the model: generation with exact tokens and log-probs, training steps, checkpoints.

Heavy libraries (torch, transformers, verl, ray) are imported only inside ``swarm.backends.*``.
``load_backend`` is the one entry point the server uses; it imports the chosen backend lazily.
"""

from swarm.backends.base import (
    Backend,
    Generation,
    RowFeed,
    SamplingParams,
    TokenCallback,
    TrainConfig,
    TrainSample,
)

__all__ = [
    "Backend",
    "Generation",
    "RowFeed",
    "SamplingParams",
    "TokenCallback",
    "TrainConfig",
    "TrainSample",
    "load_backend",
]


def load_backend(model: str, config: TrainConfig, *, seed: int = 0, kind: str = "torch") -> Backend:
    """Build the backend ``kind`` for ``model`` ("tiny" or a local Hugging Face folder)."""
    if kind == "torch":
        from swarm.backends.torch import TorchBackend

        return TorchBackend.from_model(model, config, seed=seed)
    raise ValueError(f"unknown backend {kind!r}; available: torch")
