"""The CPU platform verl 0.9.1 needs to train on CPU (gloo), kept in the project and pinned.

verl 0.9.1 knows only CUDA, NPU and ROCm platforms: on a machine without accelerators it falls back
to ``cuda``/``nccl``, and ``VERL_PLATFORM=cpu`` alone raises "Unknown platform 'cpu'". Training on
CPU (tests, CI, laptops) needs five things, all provided here through verl's own extension points
rather than edits to verl:

1. a ``cpu`` platform registered with ``verl.plugin.platform.PlatformRegistry`` and made current
   (device ``cpu``, backend ``gloo``, Ray resource ``CPU``, memory statistics that report 0);
2. a plain ``gloo`` process group, created before verl's ``TrainingWorker`` would build its
   ``"cpu:gloo,{device}:{backend}"`` string (a duplicate ``cpu`` entry torch refuses);
3. ``VERL_ENGINE_DEVICE=cuda``, which only picks the FSDP engine class (registered for cuda/npu);
4. verl seeing trl as unavailable (``trl_guard.hide_trl``; needed on every device);
5. model settings that run on CPU: ``attn_implementation="sdpa"`` and fp32 (see
   ``MODEL_OVERRIDES`` / ``MIXED_PRECISION``; ``compat`` resolves them per device).

Inside the Ray worker processes the platform must exist before verl code first asks for it (some
verl modules read it at import), so ``worker_env()`` names ``swarm.backends.verl._cpu_plugin`` in
``VERL_USE_EXTERNAL_MODULES``: ``import verl`` then imports that module, which calls ``activate()``.
The driver process calls ``activate()`` itself. Any other verl version is refused
(``check_verl_version``); ``tests/unit/swarm/backends/test_verl_cpu_platform.py`` fails loudly when one
of the verl internals used here moves.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from swarm.backends.verl.trl_guard import TRL_USERS as _TRL_USERS  # noqa: F401 - named by the platform tests
from swarm.backends.verl.trl_guard import hide_trl

__all__ = [
    "MIXED_PRECISION",
    "MODEL_OVERRIDES",
    "PLATFORM_NAME",
    "VERL_VERSION",
    "activate",
    "check_verl_version",
    "init_process_group",
    "worker_env",
]

VERL_VERSION = "0.9.1"
PLATFORM_NAME = "cpu"
PLUGIN_MODULE = "swarm.backends.verl._cpu_plugin"
# Model and precision settings that run on CPU (flash-attention and bf16 autocast do not).
MODEL_OVERRIDES = {"attn_implementation": "sdpa"}
MIXED_PRECISION = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def check_verl_version() -> None:
    """``RuntimeError`` unless the installed verl is the version this module was written for."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("verl")
    except PackageNotFoundError:
        raise RuntimeError(f"the verl trainer needs verl=={VERL_VERSION}, which is not installed") from None
    if found != VERL_VERSION:
        raise RuntimeError(
            f"the verl trainer's CPU platform is written for verl=={VERL_VERSION}, found verl=={found}; "
            "re-check swarm/backends/verl/cpu_platform.py against the new version (run its tests) before "
            "changing the pin"
        )


def worker_env() -> dict[str, str]:
    """Environment for Ray worker processes (``RayWorkerGroup(worker_env=...)``) that train on CPU."""
    return {
        "VERL_PLATFORM": PLATFORM_NAME,
        "VERL_ENGINE_DEVICE": "cuda",  # selects the FSDP engine class only; the device is the platform's
        "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        "TOKENIZERS_PARALLELISM": "false",
    }


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


@functools.cache
def _device_module() -> Any:
    """``torch.cpu`` plus the CUDA-style calls verl makes on its device module (as no-ops or 0)."""
    import psutil
    import torch

    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    names = ("current_device", "device_count", "is_available", "synchronize", "current_stream", "stream",
             "set_device", "Stream", "Event", "StreamContext")
    members = {n: getattr(torch.cpu, n) for n in names if hasattr(torch.cpu, n)}
    members.update(
        empty_cache=_no_op,
        ipc_collect=_no_op,
        reset_peak_memory_stats=_no_op,
        set_per_process_memory_fraction=_no_op,
        memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_allocated=_zero,
        max_memory_reserved=_zero,
        mem_get_info=mem_get_info,
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_device_name=lambda *a, **k: "cpu",
    )
    return SimpleNamespace(**members)


class _CpuPlatform:
    """The members of verl's ``PlatformBase`` for CPU-only processes: gloo collectives, Ray ``CPU``
    resources. Plain Python here; ``_platform_class`` mixes it into verl's base class lazily."""

    device_name = "cpu"
    vendor_name = "cpu"

    @property
    def device_module(self) -> Any:
        return _device_module()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: chosen explicitly by VERL_PLATFORM or activate()

    def current_device(self) -> Any:
        return "cpu"  # torch.cpu.current_device(); usable in tensor.to(...)

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        self.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, float]:
        return {}  # CPU actors are placed by their placement-group bundle alone

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


@functools.cache
def _platform_class() -> type:
    """The ``PlatformBase`` subclass for CPU (built lazily: importing verl imports Ray)."""
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(_CpuPlatform, PlatformBase):
        """verl platform for CPU-only processes (see ``_CpuPlatform``)."""

    return PlatformCPU


def activate() -> None:
    """Register the ``cpu`` platform, make it verl's current platform, and hide trl from verl.

    Idempotent. Called in the driver by the trainer and in Ray workers by ``_cpu_plugin``.
    """
    check_verl_version()
    from verl.plugin.platform import PlatformRegistry, platform_manager, set_platform

    cls = _platform_class()
    if PlatformRegistry.get(PLATFORM_NAME) is not cls:
        PlatformRegistry.register(PLATFORM_NAME)(cls)
    if not isinstance(platform_manager._current_platform, cls):
        set_platform(cls())
    hide_trl()  # device-independent (``trl_guard``); in CPU workers this plugin path is the one that runs


def init_process_group() -> None:
    """Create the default ``gloo`` process group from the env verl's worker group sets
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), if none exists yet.

    verl's ``TrainingWorker`` only creates one when none exists, so calling this first replaces
    its ``"cpu:gloo,cpu:gloo"`` backend string with plain ``gloo``. A group is needed even for one
    process (FSDP2 builds a device mesh on it).
    """
    import torch.distributed

    if torch.distributed.is_initialized():
        return
    torch.distributed.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        init_method=os.environ.get("DIST_INIT_METHOD"),
    )
