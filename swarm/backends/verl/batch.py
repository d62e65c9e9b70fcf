"""Engine samples → the padding-free ``TensorDict`` verl's ``TrainingWorker`` consumes, and back.

Layout (verl's agent-loop convention, built by ``convert.samples_to_data_proto``): prompt = the
tokens before the first generated token (left-padded), response = the rest (right-padded),
``response_mask`` 1 on generated tokens. ``left_right_2_no_padding`` then packs each row to its real
tokens, as verl's own PPO trainer does before ``infer_batch``/``train_batch``.

Shapes: ``n`` real samples, ``R`` the longest response. Per-token tensors returned to the driver
(``log_probs``, ``entropy``) are ``(rows, R)``; ``rows >= n`` when filler rows were added so the
batch splits evenly over the data-parallel workers. Filler rows copy row 0 with an all-zero
``response_mask``: they add nothing to any loss or token count (losses are normalised by the
global token/sequence counts, which exclude them) and are dropped from every metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from swarm.backends.base import TrainSample, validate_samples

if TYPE_CHECKING:
    from verl import DataProto  # read as Any: verl is not type-checked through

__all__ = ["PackedBatch", "pack_samples", "to_no_padding", "to_padded", "trainable_samples"]


def trainable_samples(samples: Sequence[TrainSample], vocab_size: int, max_context: int) -> list[TrainSample]:
    """The samples checked by the rules every trainer applies (``ValueError``), without those that
    have no trainable token (a reply cut to nothing at a stop string): they add nothing to any loss
    (the normalisers count only sequences with tokens) and verl's packing wants none."""
    validate_samples(samples, vocab_size, max_context)
    return [s for s in samples if 1 in s.loss_mask[1:]]


@dataclass
class PackedBatch:
    """A ``DataProto`` in verl's left/right-padded layout plus what the trainer needs to read it."""

    data: DataProto  # its batch gains old_log_probs etc. before training
    samples: int  # real rows (the first ``samples`` rows); the rest are filler
    response_mask: torch.Tensor  # (rows, R) float, zero on filler rows
    rollout: torch.Tensor  # (rows, R) recorded rollout log-probs
    horizon: int  # longest sequence length - 1: the torch trainer's seq-mean-token-sum-norm scale
    sources: list[str] = field(default_factory=list)  # per real row: the pool member that sampled it ("": unknown)

    @property
    def tokens(self) -> float:
        return float(self.response_mask.sum())


def pack_samples(samples: Sequence[TrainSample], pad_token_id: int, dp_size: int, *,
                 unit_temperature: bool = False) -> PackedBatch:
    """Build the batch (``temperature`` per row: the sample's, 0 read as 1) padded to ``dp_size``."""
    from swarm.backends.verl.convert import samples_to_data_proto

    # A token at index 0 has no logit that scores it: train from index 1, as the torch trainer does.
    rows = [s if s.loss_mask[0] == 0 else replace(s, loss_mask=[0, *s.loss_mask[1:]]) for s in samples]
    filler = (-len(rows)) % dp_size
    rows += [rows[0]] * filler
    data = samples_to_data_proto(rows, rewards=[0.0] * len(rows), group_ids=[str(i) for i in range(len(rows))],
                                 pad_token_id=pad_token_id)
    batch = data.batch
    if filler:
        batch["response_mask"][len(samples):] = 0
        batch["advantages"][len(samples):] = 0.0
    temps = [1.0 if unit_temperature or s.temperature <= 0 else float(s.temperature) for s in rows]
    batch["temperature"] = torch.tensor(temps, dtype=torch.float32)
    for key in ("rm_scores",):  # rewards are already folded into the advantages
        batch.pop(key)
    data.non_tensor_batch.pop("uid", None)
    return PackedBatch(
        data=data,
        samples=len(samples),
        response_mask=batch["response_mask"].float(),
        rollout=batch["rollout_log_probs"].float(),
        horizon=max(len(s.tokens) for s in samples) - 1,
        sources=[s.source for s in samples],
    )


def to_no_padding(data: DataProto, **meta: Any) -> Any:  # verl's TensorDict
    """verl's padding-free ``TensorDict`` of ``data`` with non-tensor ``meta`` attached."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, **meta)
    return td


def to_padded(output: Any, key: str, td: Any) -> torch.Tensor:
    """A per-token output of ``infer_batch`` (nested, prompt + response) as ``(rows, R)`` floats."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(tu.get(output, key), td).float()
