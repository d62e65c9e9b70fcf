"""GPUs split on purpose between the vLLM generator and the trainer (``--generator-gpus``/``--trainer-gpus``).

Without a split, verl's Ray workers and the vLLM child both take GPU 0: vLLM's start-up memory check
fails (it wants 90% of the device) or verl runs out of memory on its first step. ``split_gpus``
decides, before anything starts, which devices each side gets:

- ids are the CUDA devices this server process sees (``0..N-1``, as torch numbers them); with the
  server's own ``CUDA_VISIBLE_DEVICES`` set they index that list, and ``GpuSplit`` holds the
  physical ids the processes started from here need (the vLLM child's ``CUDA_VISIBLE_DEVICES``,
  the GPUs a local Ray cluster declares);
- with neither flag and a vLLM generator, vLLM gets the last visible GPU and the trainer the rest
  (one GPU: both share it, and a colocated vLLM must be given a lower
  ``gpu_memory_utilization``); one flag alone gives the other side the remaining GPUs;
- both flags may name the same GPU on purpose (colocation); NCCL weight transfer then cannot be used
  (``disjoint`` is false), so ``--weight-transfer auto`` picks the disk path.

The in-process torch engine runs where ``--device`` puts it (``torch_device``): ``auto`` takes the first
visible GPU that the split did not give to a vLLM child or verl's workers, else the CPU, in the dtype
``--dtype`` names (``torch_dtype``: ``auto`` is bf16 on a GPU that has it, fp32 on the CPU).
``--trainer-gpus`` places the verl trainer's Ray workers (an existing cluster, ``--ray-address``, keeps
its own GPUs).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["DEVICE_CHOICES", "DTYPE_CHOICES", "GpuSplit", "parse_gpus", "split_gpus", "torch_device",
           "torch_dtype", "visible_cuda", "visible_gpus"]

# vLLM's default share of a GPU it has to itself; with a trainer on the same GPU it must leave room.
OWN_GPU_MEMORY = 0.9
SHARED_GPU_MEMORY = 0.4
DEVICE_CHOICES = "auto|cpu|cuda|cuda:N"
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class GpuSplit:
    """Physical GPU ids per side (empty: that side runs on the CPU or in the server process)."""

    generator: tuple[str, ...] = ()
    trainer: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        return bool(self.generator or self.trainer)

    @property
    def disjoint(self) -> bool:
        """True when the generator has GPUs of its own (NCCL refuses two ranks on one device)."""
        return bool(self.generator) and not set(self.generator) & set(self.trainer)

    def gpu_memory_utilization(self, requested: float | None) -> float:
        """``requested``, else vLLM's share: most of a GPU of its own, less of a shared one."""
        if requested is not None:
            return requested
        return OWN_GPU_MEMORY if self.disjoint or not self.trainer else SHARED_GPU_MEMORY


def parse_gpus(text: str | None) -> list[int] | None:
    """``"0,2"`` -> ``[0, 2]``; None stays None. ``ValueError`` on anything else or a repeated id."""
    if text is None:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"GPU list {text!r}: expected comma-separated device numbers such as '0,1'") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"GPU list {text!r}: expected distinct, non-negative device numbers such as '0,1'")
    return ids


def visible_gpus(count: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """Physical ids of the ``count`` CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` order)."""
    environ = os.environ if environ is None else environ
    listed = [part.strip() for part in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if listed:
        return listed[:count]
    return [str(i) for i in range(count)]


def split_gpus(visible: Sequence[str], *, generator: str | None = None, trainer: str | None = None,
               vllm: bool = True, verl: bool = True) -> GpuSplit:
    """Decide which visible GPUs the vLLM generator and the trainer get (see the module docstring).

    ``visible``: physical ids in the order this process numbers them. ``vllm``/``verl``: whether
    the generator is a vLLM child and the trainer verl's Ray workers (other engines live in the
    server process). ``ValueError`` for ids that are not visible or a side left without a GPU.
    """
    gen_ids, train_ids = parse_gpus(generator), parse_gpus(trainer)
    for name, ids in (("--generator-gpus", gen_ids), ("--trainer-gpus", train_ids)):
        if ids and max(ids) >= len(visible):
            raise ValueError(f"{name} {','.join(map(str, ids))}: this server sees {len(visible)} CUDA device(s)")
    if not visible:
        return GpuSplit()
    every = list(range(len(visible)))
    if not vllm:
        gen_ids = []
    elif gen_ids is None:
        rest = [i for i in every if i not in (train_ids or [])]
        gen_ids = rest[-1:] if train_ids is not None else every[-1:]
        if not gen_ids:
            raise ValueError("--trainer-gpus takes every GPU: give the vLLM generator one with --generator-gpus")
    if not verl:
        train_ids = [0]  # the in-process torch trainer uses the server's first device
    elif train_ids is None:
        train_ids = [i for i in every if i not in gen_ids] or every[:1]
    split = GpuSplit(tuple(visible[i] for i in gen_ids), tuple(visible[i] for i in train_ids))
    if split.generator and not split.disjoint:
        logger.warning("the vLLM generator shares GPU(s) %s with the trainer: NCCL weight transfer is off and "
                       "vLLM takes %.0f%% of the memory (gpu_memory_utilization)", ",".join(split.generator),
                       100 * split.gpu_memory_utilization(None))
    return split


def visible_cuda() -> tuple[list[str], bool]:
    """The physical ids of the CUDA devices this process sees, and whether they do bfloat16."""
    import torch

    if not torch.cuda.is_available():
        return [], False
    return visible_gpus(torch.cuda.device_count()), torch.cuda.is_bf16_supported()


def torch_device(requested: str, *, visible: Sequence[str], split: GpuSplit, vllm_child: bool, verl: bool) -> str:
    """Where the in-process torch engine runs: ``cpu`` or ``cuda:N`` (N as this process numbers its GPUs).

    ``auto``: the first visible GPU that ``split`` gave neither to a vLLM child (``vllm_child``) nor to
    verl's workers (``verl``), else ``cpu``. ``cuda`` is ``cuda:0``. ``ValueError`` for a GPU this
    process does not see or anything else."""
    name = requested.strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "auto":
        given_away = set(split.generator if vllm_child else ()) | set(split.trainer if verl else ())
        free = [index for index, physical in enumerate(visible) if physical not in given_away]
        return f"cuda:{free[0]}" if free else "cpu"
    index_text = name.removeprefix("cuda").removeprefix(":") if name.startswith("cuda") else None
    if index_text is None or (index_text and not index_text.isdigit()):
        raise ValueError(f"device {requested!r}: expected {DEVICE_CHOICES}")
    index = int(index_text or 0)
    if index >= len(visible):
        raise ValueError(f"device {requested!r}: this server sees {len(visible)} CUDA device(s)")
    return f"cuda:{index}"


def torch_dtype(requested: str, device: str, *, bf16_supported: bool = True) -> str:
    """The engine's dtype name: ``auto`` is ``bfloat16`` on a GPU that supports it, else ``float32``.
    ``bfloat16`` keeps fp32 master weights and optimizer state (see ``TorchBackend``)."""
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"dtype {requested!r}: expected one of {', '.join(DTYPE_CHOICES)}")
    if requested != "auto":
        return requested
    return "bfloat16" if device.startswith("cuda") and bf16_supported else "float32"
