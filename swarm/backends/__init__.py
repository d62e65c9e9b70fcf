"""Backends own the model: generation with exact tokens and log-probs, training steps, checkpoints.

Heavy libraries (torch, transformers, verl, ray) are imported only inside ``swarm.backends.*``.
``load_engines`` is the one entry point the server uses: it builds the generator and trainer a
server's settings name (``--engine torch|vllm``, ``--trainer torch|verl``), importing each lazily.
"""

from typing import TYPE_CHECKING

from swarm.backends.base import (
    Backend,
    Generation,
    Generator,
    RowFeed,
    SamplingParams,
    TokenCallback,
    TrainConfig,
    Trainer,
    TrainSample,
)

if TYPE_CHECKING:
    from swarm.server.settings import ServerSettings

__all__ = [
    "Backend",
    "Generation",
    "Generator",
    "RowFeed",
    "SamplingParams",
    "TokenCallback",
    "TrainConfig",
    "TrainSample",
    "Trainer",
    "load_backend",
    "load_engines",
]


def load_backend(model: str, config: TrainConfig, *, seed: int = 0, kind: str = "torch") -> Backend:
    """Build the backend ``kind`` for ``model`` ("tiny" or a local Hugging Face folder)."""
    if kind == "torch":
        from swarm.backends.torch import TorchBackend

        return TorchBackend.from_model(model, config, seed=seed)
    raise ValueError(f"unknown backend {kind!r}; available: torch")


def load_engines(settings: "ServerSettings") -> tuple[Backend | None, Generator | None, Trainer | None]:
    """``(backend, generator, trainer)`` for ``create_app``: the in-process torch model when either
    role is torch (it plays every torch role), plus the other engines the settings name."""
    backend = None
    if settings.engine == "torch" or settings.trainer == "torch":
        backend = load_backend(settings.model, settings.config, seed=settings.seed)
    generator = None
    if settings.engine == "vllm":
        raise ValueError("--engine vllm is not available in this build yet")
    trainer = None
    if settings.trainer == "verl":
        raise ValueError("--trainer verl is not available in this build yet")
    return backend, generator, trainer
