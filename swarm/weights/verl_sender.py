"""The verl trainer as a ``WeightSender``: its FSDP workers stream their parameters into vLLM over NCCL.

Every worker gathers each parameter from its shards on its GPU, one at a time; rank 0 casts it to
bf16 and broadcasts it, packed into buckets, into vLLM's NCCL weight-transfer group
(``swarm.weights.nccl``). Nothing passes through the server process, the Ray object store
or a folder. It needs CUDA and vLLM 0.32 importable in the workers' Python (``probe``); the
generator's transfer choice (``swarm.weights.transfer.choose_transfer``) falls back to the
disk path when they are missing. Not run on this project's CPU machines.
"""

from __future__ import annotations

from typing import Any, Protocol

from swarm.weights.base import Weights
from swarm.weights.transfer import SenderProbe

__all__ = ["VerlNcclSender", "WorkerGroup"]


class WorkerGroup(Protocol):
    """What the sender needs of a ``VerlTrainer``: its device, and a call on every worker."""

    @property
    def device(self) -> str: ...

    def worker_call(self, method: str, *args: Any) -> Any:
        """Rank 0's answer to ``method`` called on every worker."""
        ...


class VerlNcclSender:
    """``WeightSender`` over a ``VerlTrainer``'s worker group (blocking calls; see the module docstring)."""

    streams = True
    where = "the verl workers"

    def __init__(self, trainer: WorkerGroup, timeout: float = 600.0) -> None:
        self.trainer = trainer
        self.timeout = timeout

    def probe(self) -> SenderProbe:
        if self.trainer.device == "cpu":  # no GPU: nothing to ask the workers
            return SenderProbe(where=self.where, cuda=False)
        return SenderProbe(**self.trainer.worker_call("probe_weight_sender"))

    def connect(self, url: str) -> None:
        self.trainer.worker_call("connect_vllm", url, self.timeout)

    def send(self, weights: Weights | None) -> None:
        self.trainer.worker_call("send_to_vllm")

    def abort(self) -> None:
        self.trainer.worker_call("abort_vllm")
