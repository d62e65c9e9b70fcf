"""``load_roles``: the generator and the trainer a process runs, and the in-process torch model when
either is torch, built from its settings (``swarm serve`` and ``swarm worker``).

The in-process torch model when either role is torch (it plays every torch role), the vLLM
generator (a child process it owns, or ``--vllm-url``) and the verl trainer, each imported only
when named (``--engine torch|vllm``, ``--trainer torch|verl``). GPUs are split between them first
(``swarm.devices``); the vLLM generator's weight transfer follows the trainer it gets
(``swarm.weights.wiring``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swarm.backends import load_backend
from swarm.backends.base import Generator, InProcessModel, Trainer

if TYPE_CHECKING:
    from swarm.config import ServerSettings
    from swarm.devices import GpuSplit

__all__ = ["load_roles"]


def load_roles(settings: ServerSettings) -> tuple[InProcessModel | None, Generator | None, Trainer | None]:
    """``(backend, generator, trainer)`` for ``create_app``: the in-process torch model when either
    role is torch (it plays every torch role), plus the other engines the settings name."""
    from swarm.devices import split_gpus, torch_device, torch_dtype, visible_cuda

    # GPUs split before anything starts: the vLLM child's are kept out of verl's Ray workers, and
    # the in-process torch engine takes none of either (``--device auto``).
    if (settings.deterministic or settings.coupled) and settings.engine != "torch":
        # vLLM samples from its own per-request streams, and its batch-invariant mode (VLLM_BATCH_INVARIANT=1)
        # needs an NVIDIA GPU of compute capability 8.0 or more: no counter-based noise to share with it here.
        flag = "--deterministic" if settings.deterministic else "--coupled"
        raise ValueError(f"{flag} needs --engine torch: the vLLM engine draws its sampling noise from "
                         "vLLM's own per-request streams (and vLLM's batch-invariant mode needs a recent GPU)")
    vllm_child, verl = settings.engine == "vllm" and not settings.vllm_url, settings.trainer == "verl"
    visible, bf16 = visible_cuda()
    split = split_gpus(visible, generator=settings.generator_gpus, trainer=settings.trainer_gpus, vllm=vllm_child,
                       verl=verl)
    backend = None
    if settings.engine == "torch" or settings.trainer == "torch":
        device = torch_device(settings.device, visible=visible, split=split, vllm_child=vllm_child, verl=verl)
        backend = load_backend(settings.model, settings.config, seed=settings.seed, device=device,
                               dtype=torch_dtype(settings.dtype, device, bf16_supported=bf16),
                               decode_cache=settings.decode_cache)
    trainer = None
    if settings.trainer == "verl":
        from swarm.backends.verl import VerlTrainer

        trainer = VerlTrainer(settings.model, settings.config, workers=settings.workers,
                              ray_address=settings.ray_address, seed=settings.seed, gpus=split.trainer or None)
    generator = None
    if settings.engine == "vllm":  # after the trainer: the weight transfer depends on where it runs
        try:
            generator = _vllm_generator(settings, trainer or backend, split)
        except BaseException:
            if trainer is not None:  # e.g. an explicit --weight-transfer nccl that cannot work
                trainer.close()
            raise
    return backend, generator, trainer


def _vllm_generator(settings: ServerSettings, trainer: Any, split: GpuSplit) -> Generator:
    """A vLLM generator on the model's folder: a child process it owns, or ``--vllm-url``; its GPUs
    and its weight transfer (``swarm.weights.wiring``) follow the settings."""
    from swarm.backends.vllm import VllmGenerator
    from swarm.models.resolve import model_name, resolve_model_folder
    from swarm.weights.wiring import transfer_options

    folder = resolve_model_folder(settings.model, seed=settings.seed).resolve()
    options = {"model_name": model_name(settings.model, folder), "mode": settings.config.mode,
               "max_context": settings.max_context,
               **transfer_options(settings.weight_transfer, trainer, split, attached=bool(settings.vllm_url))}
    if settings.vllm_url:
        return VllmGenerator.attach(settings.vllm_url, folder, settings.state_dir, **options)
    return VllmGenerator.launch(folder, settings.state_dir, python=settings.vllm_python,
                                max_model_len=settings.max_context, gpus=split.generator,
                                gpu_memory_utilization=split.gpu_memory_utilization(settings.gpu_memory_utilization),
                                **options)
