"""What a process that would send weights to vLLM over NCCL can do (``SenderProbe``), and the vLLM
series the weight-transfer code was read against. A leaf: ``transfer`` decides with it, ``nccl``
(which needs torch, so ``transfer`` imports it only when a link connects) fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VLLM_SERIES", "SenderProbe"]

# The vLLM whose weight-transfer API this code was read against (its trainer engine's signature moves).
VLLM_SERIES = "0.32."


@dataclass(frozen=True)
class SenderProbe:
    """What the process that would send weights over NCCL can do (``nccl.probe_here`` fills it)."""

    where: str  # "the server process", "the verl workers"
    cuda: bool
    vllm: str | None = None  # the vLLM version importable there
    problem: str | None = None  # why vLLM's NCCL engine cannot be imported there
