"""How each published policy version reaches vLLM: the transfer, chosen safely, and its two kinds.

``disk`` (``DiskTransfer``): the weights are written as a loadable folder (``folder``), then every
vLLM worker reloads them in place. It works wherever the server and vLLM share a filesystem and is
the path tested here (CPU). On GPU the folder is written in bf16.

``nccl`` (``NcclTransfer``): a ``WeightSender`` running where the weights are streams them into
vLLM's own NCCL weight-transfer engine, per parameter and packed into buckets, with no CPU state
dict and no folder per step. Two senders exist: ``LocalNcclSender`` (the in-process torch trainer)
and the verl trainer's (``swarm.weights.verl_sender``: its FSDP workers gather each parameter on
the GPU and rank 0 broadcasts). Both need vLLM 0.32 importable *where the sender runs*, CUDA there,
and a vLLM on other GPUs (NCCL refuses two ranks on one device).

``choose_transfer`` applies exactly those conditions: ``auto`` picks ``nccl`` only when all hold,
else ``disk``, and says why; an explicit ``nccl`` that cannot work is refused at start. The
generator (``swarm.backends.vllm.generator``) runs a transfer's ``apply`` while new requests are
held back; the server's publication (``swarm.server.training.generator_sync``) turns any failure or
timeout into an ``error`` event and has the generator restart on the latest weights
(``VllmGenerator.recover``).

Blocking sender calls run on daemon threads (``in_daemon_thread``): a send stuck inside NCCL can
then be abandoned after a timeout without holding the server's shutdown hostage.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import httpx

from swarm.devices import GpuSplit
from swarm.weights.base import Weights, WeightTransport
from swarm.weights.folder import reload_from_folder, write_weights_folder
from swarm.weights.probe import VLLM_SERIES, SenderProbe

logger = logging.getLogger(__name__)

# VLLM_SERIES and SenderProbe live in sender_probe (nccl fills them in too); still importable from here.
__all__ = [
    "VLLM_SERIES",
    "DiskTransfer",
    "LocalNcclSender",
    "NcclTransfer",
    "SenderProbe",
    "TransferChoice",
    "WeightSender",
    "WeightTransfer",
    "choose_transfer",
    "in_daemon_thread",
]

TransferKind = Literal["disk", "nccl"]
T = TypeVar("T")


@dataclass(frozen=True)
class TransferChoice:
    kind: TransferKind
    reason: str


def choose_transfer(requested: str, probe: SenderProbe, split: GpuSplit) -> TransferChoice:
    """``disk`` or ``nccl`` for ``--weight-transfer requested`` (see the module docstring).

    ``ValueError`` for an unknown value or an explicit ``nccl`` that cannot work.
    """
    if requested not in ("auto", "disk", "nccl"):
        raise ValueError(f"weight_transfer must be auto, disk or nccl, got {requested!r}")
    if requested == "disk":
        return TransferChoice("disk", "requested (--weight-transfer disk)")
    problem = _nccl_problem(probe, split)
    if problem is None:
        how = "requested" if requested == "nccl" else "auto"
        return TransferChoice("nccl", f"{how}: vLLM {probe.vllm} and CUDA in {probe.where}, vLLM on GPU(s) "
                                      f"{','.join(split.generator)} apart from the trainer's")
    if requested == "nccl":
        raise ValueError(f"--weight-transfer nccl cannot work here: {problem}; use disk or auto")
    return TransferChoice("disk", f"auto: {problem}")


def _nccl_problem(probe: SenderProbe, split: GpuSplit) -> str | None:
    """Why NCCL weight transfer cannot work, or None when it can."""
    if not probe.cuda:
        return f"no CUDA in {probe.where}"
    if probe.vllm is None:
        return f"vLLM is not importable in {probe.where} ({probe.problem or 'not installed'})"
    if not probe.vllm.startswith(VLLM_SERIES):
        return f"{probe.where} has vLLM {probe.vllm}; this code targets vLLM {VLLM_SERIES}*"
    if not split.generator:
        return "the vLLM generator has no GPU of its own (--generator-gpus)"
    if not split.disjoint:
        return f"the vLLM generator shares GPU(s) {','.join(split.generator)} with the trainer"
    return None


async def in_daemon_thread(fn: Callable[[], T]) -> T:
    """Run blocking ``fn`` on a fresh daemon thread and await it. Unlike ``asyncio.to_thread``, a
    call that never returns (a peer gone inside an NCCL collective) can be abandoned after a
    timeout: nothing joins the thread at shutdown."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result)

    threading.Thread(target=run, name="swarm-weight-send", daemon=True).start()
    return await future


class WeightSender(Protocol):
    """Streams the trainer's weights into vLLM over NCCL from where they are. Blocking methods."""

    streams: bool  # True: the trainer sends its own weights (``send(None)``); False: it sends the given dict
    where: str  # the process(es) it runs in, for messages ("the server process")

    def probe(self) -> SenderProbe:
        """Whether this sender can work (CUDA, vLLM importable) where it runs."""
        ...

    def connect(self, url: str) -> None:
        """Rendezvous with the vLLM server at ``url`` (once per vLLM process)."""
        ...

    def send(self, weights: Weights | None) -> None:
        """Stream one version (start, update + broadcast, finish)."""
        ...

    def abort(self) -> None:
        """Tear the NCCL group down, unblocking a send stuck in it; ``connect`` again before the next send."""
        ...


class WeightTransfer(WeightTransport[Path | None]):
    """A ``WeightTransport`` into one vLLM server, as the generator calls it: ``stage`` while requests
    still run, ``apply`` (the delivery) while they are held back, and ``reset`` after vLLM restarted or
    a publication failed."""

    kind: TransferKind
    streams: bool  # True: ``stage``/``apply`` take no weights, the trainer streams its own

    @abstractmethod
    async def apply(self, url: str, client: httpx.AsyncClient, staged: Path | None, weights: Weights | None) -> None:
        """Make the vLLM server at ``url`` serve the staged version."""


class DiskTransfer(WeightTransfer):
    """A folder per version (``root/v<version>``), reloaded in place by every vLLM worker."""

    kind: TransferKind = "disk"
    streams = False

    def __init__(self, model_dir: Path, root: Path, *, dtype: str | None = None, timeout: float = 600.0) -> None:
        self.model_dir = model_dir
        self.root = root
        self.dtype = dtype  # "bfloat16" on GPU; None keeps the trainer's dtype (fp32 on CPU)
        self.timeout = timeout

    async def stage(self, version: int, weights: Weights | None) -> Path:
        if weights is None:
            raise ValueError("the disk transfer needs the weights")
        return await asyncio.to_thread(write_weights_folder, weights, self.model_dir, self.root, version, self.dtype)

    async def apply(self, url: str, client: httpx.AsyncClient, staged: Path | None, weights: Weights | None) -> None:
        if staged is None:
            raise ValueError("the disk transfer applies a staged folder")
        await reload_from_folder(client, url, staged, timeout=self.timeout)

    def reset(self) -> None:
        """Nothing is kept between versions."""


class NcclTransfer(WeightTransfer):
    """Weights streamed by a ``WeightSender`` into vLLM's NCCL engine; no folder per version."""

    kind: TransferKind = "nccl"

    def __init__(self, sender: WeightSender) -> None:
        self.sender = sender
        self.streams = sender.streams
        self._connected: str | None = None  # the vLLM url the sender's NCCL group reaches

    async def stage(self, version: int, weights: Weights | None) -> None:
        return None

    async def apply(self, url: str, client: httpx.AsyncClient, staged: Path | None, weights: Weights | None) -> None:
        if self._connected != url:
            await in_daemon_thread(lambda: self.sender.connect(url))
            self._connected = url
        await in_daemon_thread(lambda: self.sender.send(weights))

    def reset(self) -> None:
        """Abort the NCCL group (off the event loop: an abort may wait on a stuck collective)."""
        if self._connected is None:
            return
        self._connected = None
        threading.Thread(target=self._abort, name="swarm-nccl-abort", daemon=True).start()

    def _abort(self) -> None:
        try:
            self.sender.abort()
        except Exception:  # the group is abandoned either way
            logger.exception("aborting the NCCL weight-transfer group failed")


class LocalNcclSender:
    """The in-process torch trainer's sender: streams the dict it is given, parameter by parameter,
    moved to this process's GPU and cast to bf16, as NCCL rank 0 of vLLM's weight-transfer group.
    Untested here (no GPU)."""

    streams = False
    where = "the server process"

    def __init__(self, request_timeout: float = 600.0) -> None:
        self.request_timeout = request_timeout
        self._link: Any = None
        self._weights: Weights = {}

    def probe(self) -> SenderProbe:
        from swarm.weights.nccl import probe_here  # nccl imports torch: only when this sender is used

        return probe_here(self.where)

    def connect(self, url: str) -> None:
        from swarm.weights.nccl import NcclLink, ParamStream

        stream = ParamStream(lambda: self._weights.items(), device="cuda")  # NCCL sends from the GPU
        self._link = NcclLink(url, stream, rank=0, timeout=self.request_timeout)
        self._link.connect()

    def send(self, weights: Weights | None) -> None:
        if self._link is None:
            raise RuntimeError("connect() the NCCL sender first")
        self._weights = weights or {}
        try:
            self._link.send()
        finally:
            self._weights = {}

    def abort(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.abort()
