"""The finished-episode record the durable buffer stores, and its compact binary encoding.

``FinishedEpisode`` is what the core hands to ``EpisodeStore.save_finished``: the claim's fields,
the client's finish body (``Outcome``) and the token-exact trace (``swarm.server.records.timeline``).
``from_trace`` copies the stored part of the live trace; a restart trains on the stored ``trace`` as it
is. Arrays are stored little-endian: token ids and policy versions as int32, log-probs as **float32**
(exact enough for importance ratios; about 1e-7 relative), loss masks as one byte per token,
constrained spans (``Timeline.constrained``) as int32 ``start, end`` pairs.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.server.records.timeline import EpisodeTrace, Timeline

__all__ = ["FinishedEpisode", "InvalidEpisode", "Outcome", "body_digest", "pack_array", "unpack_array"]


class InvalidEpisode(ValueError):
    """A record that must not be stored (non-finite reward, inconsistent timeline lengths, …)."""


@dataclass
class Outcome:
    """What the client reported with ``finish``. Kept together because a retried finish is the same
    one exactly when all three match (anything else is a conflict: a finish is final)."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinishedEpisode:
    """One finished episode as the core hands it over: the claim's fields, the client's ``outcome``
    and the stored part of its ``trace`` (the live agent-protocol counters are not kept)."""

    episode_id: str
    task_id: str
    group_id: str
    group_size: int
    category: str | None
    client_id: str
    outcome: Outcome
    finished_at: float = field(default_factory=time.time)
    trace: EpisodeTrace = field(default_factory=EpisodeTrace)
    # The server's group *instance* (one group_id can be played many times); None = group_id.
    group_key: str | None = None

    @property
    def group(self) -> str:
        return self.group_key or self.group_id

    @classmethod
    def from_trace(cls, trace: EpisodeTrace, **fields: Any) -> FinishedEpisode:
        """Build from a copy of the core's live trace plus the episode's fields (``episode_id=…, outcome=…``)."""
        stored = EpisodeTrace(merge=trace.merge, timelines=[_copy_timeline(t) for t in trace.timelines],
                              calls=trace.calls, drift_forks=trace.drift_forks)
        return cls(trace=stored, **fields)

    def validate(self) -> None:
        """Raise ``InvalidEpisode`` naming the first problem; called before anything is written."""
        if not self.episode_id or not self.task_id or not self.group_id:
            raise InvalidEpisode("episode_id, task_id and group_id must be non-empty")
        if self.group_size < 1:
            raise InvalidEpisode(f"group_size must be >= 1, got {self.group_size}")
        if not math.isfinite(self.outcome.reward):
            raise InvalidEpisode(f"reward must be finite, got {self.outcome.reward}")
        if not math.isfinite(self.finished_at):
            raise InvalidEpisode("finished_at must be finite")
        for i, t in enumerate(self.trace.timelines):
            n = len(t.tokens)
            if len(t.loss_mask) != n or len(t.logprobs) != n:
                raise InvalidEpisode(
                    f"timeline {i}: lengths differ (tokens={n} mask={len(t.loss_mask)} logprobs={len(t.logprobs)})"
                )
            if any(math.isnan(x) for x in t.logprobs):
                raise InvalidEpisode(f"timeline {i}: log-probs must not be NaN")
            if any(m not in (0, 1) for m in t.loss_mask):
                raise InvalidEpisode(f"timeline {i}: loss_mask values must be 0 or 1")
            if any(not (0 <= start < end <= n) for start, end in t.constrained):
                raise InvalidEpisode(f"timeline {i}: constrained spans must lie within its {n} tokens")
            if any(not (-(2**31) <= x < 2**31) for x in (*t.tokens, *t.versions)):
                raise InvalidEpisode(f"timeline {i}: token ids and versions must fit in int32")


def _copy_timeline(t: Timeline) -> Timeline:
    return Timeline(
        tokens=list(t.tokens),
        loss_mask=list(t.loss_mask),
        logprobs=[float(x) for x in t.logprobs],
        versions=list(t.versions),
        temperature=float(t.temperature),
        calls=int(t.calls),
        constrained=[(int(a), int(b)) for a, b in t.constrained],
    )


# --------------------------------------------------------------------------- compact arrays


def pack_array(typecode: str, values: Sequence[float] | Sequence[int]) -> bytes:
    data = array(typecode, values)
    if sys.byteorder == "big":  # stored little-endian so a state dir moves between machines
        data.byteswap()
    return data.tobytes()


def unpack_array(typecode: str, blob: bytes) -> list[Any]:
    data = array(typecode)
    data.frombytes(blob)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tolist()


def body_digest(record: FinishedEpisode) -> str:
    """Identity of everything but ``finished_at`` (a retried finish carries a new time)."""
    h = hashlib.sha256()
    outcome, trace = record.outcome, record.trace
    head = [record.task_id, record.group_id, record.group_key, record.group_size, record.category, record.client_id,
            outcome.reward, outcome.metrics, outcome.metadata, trace.merge, trace.calls, trace.drift_forks]
    h.update(json.dumps(head, sort_keys=True, default=str).encode())
    for t in trace.timelines:
        h.update(pack_array("i", t.tokens))
        h.update(bytes(t.loss_mask))
        h.update(pack_array("f", t.logprobs))
        h.update(pack_array("i", t.versions))
        h.update(repr((float(t.temperature), int(t.calls))).encode())
        if t.constrained:  # only then: digests of unconstrained episodes stay what they were
            h.update(pack_array("i", [x for span in t.constrained for x in span]))
    return h.hexdigest()
