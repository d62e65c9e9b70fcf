"""How a server's settings become the vLLM generator's weight transfer (``--weight-transfer``).

The sender is the trainer's own when it has one (``VerlTrainer.nccl_sender``: its workers stream),
else the server process's (``LocalNcclSender``: the in-process torch trainer). It is probed only
when NCCL is in question (asked for, and GPUs in play): probing the verl workers imports vLLM there.
The choice and its reason are logged at start and shown in ``/api/v1/status`` (``generator``).
"""

from __future__ import annotations

import logging
from typing import Any

from swarm.devices import GpuSplit
from swarm.weights.transfer import (
    LocalNcclSender,
    NcclTransfer,
    SenderProbe,
    TransferChoice,
    WeightSender,
    choose_transfer,
)

logger = logging.getLogger(__name__)

__all__ = ["sender_for", "transfer_options"]


def sender_for(trainer: Any, timeout: float = 600.0) -> WeightSender:
    """The trainer's own NCCL sender if it has one, else one in the server process."""
    own = getattr(trainer, "nccl_sender", None)
    return own(timeout) if callable(own) else LocalNcclSender(timeout)


def pick(requested: str, sender: WeightSender, split: GpuSplit, *, attached: bool) -> TransferChoice:
    """The transfer for ``requested`` (see ``choose_transfer``); ``attached``: vLLM runs elsewhere
    (``--vllm-url``), so whether its devices are apart from the trainer's is not known here."""
    if requested == "disk" or (not split.on_gpu and not attached):
        probe = SenderProbe(where=sender.where, cuda=False)  # nothing on a GPU: no need to ask
    else:
        probe = sender.probe()
    if attached and requested != "disk":
        if requested == "auto":
            return TransferChoice("disk", "auto: the attached vLLM's devices are unknown here; pass "
                                          "--weight-transfer nccl if it runs on GPUs apart from the trainer's")
        choice = choose_transfer(requested, probe, GpuSplit(generator=("attached",)))  # its operator vouches
        return TransferChoice(choice.kind, f"requested: vLLM {probe.vllm} and CUDA in {probe.where}; the attached "
                                           "vLLM's GPUs are taken to be apart from the trainer's")
    return choose_transfer(requested, probe, split)


def transfer_options(requested: str, trainer: Any, split: GpuSplit, *, attached: bool = False,
                     timeout: float = 600.0) -> dict[str, Any]:
    """``VllmGenerator`` keyword arguments for the chosen transfer; logs the choice."""
    sender = sender_for(trainer, timeout)
    choice = pick(requested, sender, split, attached=attached)
    logger.info("weight transfer into vLLM: %s (%s)", choice.kind, choice.reason)
    options: dict[str, Any] = {"transfer_reason": choice.reason, "weights_dtype": "bfloat16" if split.on_gpu else None}
    if choice.kind == "nccl":
        options["transfer"] = NcclTransfer(sender)
    return options
