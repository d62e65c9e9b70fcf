"""Streaming weights into vLLM over NCCL from the process that holds them (not run here: no GPU).

Runs where the weights are: the server process (the torch trainer) or each verl FSDP worker.
It drives vLLM 0.32's own trainer-side engine (``vllm.distributed.weight_transfer.nccl_engine``),
imported only when a link connects, so this module needs only torch.

- ``ParamStream`` is the source that engine reads (vLLM's ``WeightSource`` contract, duck-typed):
  ``metadata()`` lists every parameter's name, wire dtype and full shape without gathering anything;
  iterating yields one parameter at a time, gathered from its FSDP shards on the GPU
  (``full_tensor()``, a collective every rank runs in the same order) and cast to bf16 there. vLLM's
  packed producer copies the pairs into a few fixed-size buffers and broadcasts each: at no point
  does a full state dict exist, on the GPU or the CPU. After a failed send, ``drain`` runs the rest
  of the pass so the other ranks' gathers still complete.
- ``NcclLink`` is that engine on one trainer rank. Rank 0 opens the NCCL group as its rank 0 at an
  address the vLLM workers can reach (``reachable_address``), learns vLLM's world size from
  ``GET /get_world_size``, and drives the update round trip over HTTP; other ranks only iterate the
  stream. ``abort`` destroys the group (``ncclCommAbort``), which unblocks a broadcast whose peer is
  gone.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch

from swarm import ports
from swarm.weights.probe import VLLM_SERIES, SenderProbe

__all__ = ["NcclLink", "ParamMeta", "ParamStream", "probe_here", "reachable_address"]

NamedTensors = Callable[[], Iterable[tuple[str, torch.Tensor]]]


@dataclass(frozen=True)
class ParamMeta:
    """vLLM's ``ParamMeta`` fields (name, wire dtype, full shape): its engine reads them by name."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def _wire_dtype(dtype: torch.dtype, wire: torch.dtype | None) -> torch.dtype:
    return wire if wire is not None and dtype.is_floating_point else dtype


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (a ``DTensor``) is all-gathered, anything else returned as is."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


class ParamStream:
    """Parameters one at a time, gathered and cast to the wire dtype (see the module docstring).

    ``params`` returns the ``(name, tensor)`` pairs afresh for each pass (``module.named_parameters``
    or a dict's ``items``): the same names in the same order on every rank. ``dtype``: the wire dtype
    of floating tensors (bf16; None keeps theirs). ``device``: where yielded tensors go (None: stay).
    """

    def __init__(self, params: NamedTensors, dtype: torch.dtype | None = torch.bfloat16,
                 device: str | torch.device | None = None) -> None:
        self.params = params
        self.dtype = dtype
        self.device = device
        self._pass: Iterator[tuple[str, torch.Tensor]] | None = None
        self.materialized = 0  # tensors gathered so far (all passes): tests check it stays lazy

    def metadata(self) -> list[ParamMeta]:
        """Every parameter's name, wire dtype and full shape; reads global shapes, gathers nothing."""
        return [ParamMeta(name, _wire_dtype(t.dtype, self.dtype), tuple(t.shape)) for name, t in self.params()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._pass = self._gather()
        return self._pass

    def drain(self) -> int:
        """Finish a pass a failed send left half-way (the gathers are collectives); tensors drained."""
        rest, self._pass = self._pass, None
        return sum(1 for _ in rest) if rest is not None else 0

    def _gather(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.params():
            with torch.no_grad():
                full = _full(tensor.detach())
                out = full.to(device=self.device or full.device, dtype=_wire_dtype(full.dtype, self.dtype))
            self.materialized += 1
            yield name, out.contiguous()
            del full, out


def probe_here(where: str, cuda: bool | None = None) -> SenderProbe:
    """Can this process send over NCCL? CUDA (``cuda`` overrides the check) and vLLM's engine importable."""
    has_cuda = torch.cuda.is_available() if cuda is None else cuda
    if not has_cuda:
        return SenderProbe(where=where, cuda=False)
    try:
        import vllm
        import vllm.distributed.weight_transfer.nccl_engine  # the engine NcclLink drives
    except Exception as exc:  # any import failure means: no NCCL sender here
        return SenderProbe(where=where, cuda=True, problem=f"{type(exc).__name__}: {exc}")
    return SenderProbe(where=where, cuda=True, vllm=str(vllm.__version__))


def reachable_address(peer_host: str) -> str:
    """This host's address as seen from ``peer_host``: loopback for a local peer, else the address of
    the interface that routes to it (no packet is sent)."""
    if peer_host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((peer_host, 9))
        return str(sock.getsockname()[0])


def vllm_world_size(url: str, timeout: float = 30.0) -> int:
    """vLLM's worker count across tensor, pipeline and data parallelism (its NCCL ranks 1..N)."""
    import httpx

    response = httpx.get(f"{url}/get_world_size", timeout=timeout)
    response.raise_for_status()
    return int(response.json()["world_size"])


class NcclLink:
    """vLLM's NCCL trainer engine on one trainer rank (rank 0 sends; see the module docstring)."""

    def __init__(self, url: str, stream: ParamStream, *, rank: int = 0, timeout: float = 600.0,
                 bucket_bytes: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.stream = stream
        self.rank = rank
        self.timeout = timeout
        self.bucket_bytes = bucket_bytes
        self._engine: Any = None

    def connect(self) -> None:
        """Open the group with vLLM's workers (rank 0) or join only the gathers (other ranks)."""
        import vllm
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        if not str(vllm.__version__).startswith(VLLM_SERIES):
            raise RuntimeError(f"vLLM {vllm.__version__} here; the NCCL sender targets vLLM {VLLM_SERIES}*")
        address, port, world = "unused", 0, 1
        if self.rank == 0:
            address = reachable_address(urlsplit(self.url).hostname or "127.0.0.1")
            port = ports.free_port(address)
            world = 1 + vllm_world_size(self.url)
        extra = {"packed_buffer_size_bytes": self.bucket_bytes} if self.bucket_bytes else {}
        info = NCCLTrainerInitInfo(master_address=address, master_port=port, world_size=world, rank=self.rank,
                                   packed=True, **extra)
        client = HTTPVLLMWeightSyncClient(self.url, timeout=self.timeout)
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=client, source=self.stream)

    def send(self) -> None:
        """One version: start, stream every parameter in packed buckets, finish. On a failure the rest
        of the pass is drained (peers' gathers complete) and the error raised."""
        if self._engine is None:
            raise RuntimeError("connect() the NCCL link first")
        try:
            self._engine.send_weights()
        except BaseException:
            self.stream.drain()
            raise

    def abort(self) -> None:
        """Destroy the NCCL group (vLLM aborts the communicator), unblocking a stuck broadcast."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
