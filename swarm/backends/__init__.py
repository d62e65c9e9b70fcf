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
        generator = _vllm_generator(settings)
    trainer = None
    if settings.trainer == "verl":
        from swarm.backends.verl import VerlTrainer

        trainer = VerlTrainer(settings.model, settings.config, workers=settings.workers,
                              ray_address=settings.ray_address, seed=settings.seed)
    return backend, generator, trainer


def _vllm_generator(settings: "ServerSettings") -> Generator:
    """A vLLM generator on the model's folder: a child process it owns, or ``--vllm-url``."""
    from swarm.backends.torch import resolve_model_folder
    from swarm.backends.vllm import VllmGenerator

    folder = resolve_model_folder(settings.model, seed=settings.seed).resolve()
    options = {"model_name": "tiny" if settings.model == "tiny" else None, "mode": settings.config.mode,
               "max_context": settings.max_context}
    if settings.vllm_url:
        return VllmGenerator.attach(settings.vllm_url, folder, settings.state_dir, **options)
    return VllmGenerator.launch(folder, settings.state_dir, python=settings.vllm_python,
                                max_model_len=settings.max_context, **options)
