"""What moves (``Weights``) and the one interface every way of moving it declares (``WeightTransport``).

A transport moves one policy version at a time from the trainer to where it is served, in two
phases. ``stage`` prepares the version while the receivers still serve the one before: a folder
written (``DiskTransfer``), a delta or snapshot encoded into chunks (``Publisher``), or nothing at
all when the weights are streamed at delivery (``NcclTransfer``). Delivery follows, and is each
implementation's own, because the receivers differ: one vLLM server at a URL, reloading or joining
an NCCL group (``WeightTransfer.apply``), or a chain of pool workers (``Publisher.relay``), each
saying which version it now holds. ``reset`` drops what is kept between versions (an NCCL group, the
base of the next delta) after a failed publication or when the receivers went away.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["Staged", "WeightTransport", "Weights"]

# A full state dict on the CPU, Hugging Face parameter names -> torch tensors (torch is imported for
# the checker only: the server imports this module without it).
Weights = Mapping[str, "torch.Tensor"]
Staged = TypeVar("Staged")  # what ``stage`` hands to the delivery: a folder, an encoded version, nothing


class WeightTransport(ABC, Generic[Staged]):
    """Moves policy versions to where they are served: ``stage`` one, deliver it (the implementation's
    own call), ``reset`` after a failure (see the module docstring)."""

    kind: str  # how it moves them, for logs and status: "disk", "nccl", "relay"

    @abstractmethod
    async def stage(self, version: int, weights: Weights | None) -> Staged:
        """Prepare ``version`` from ``weights`` while the receivers still serve the previous one;
        ``weights`` None: the trainer streams its own at delivery (only a streaming transport takes it)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget what is kept between versions; the next version starts from nothing."""
