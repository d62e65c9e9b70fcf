"""``Publisher``: the server's side of weight dissemination to its pool workers.

After each step the new version is encoded (``swarm.weights.shards``: versioned, chunked, SHA-256
checked) as a delta over the previous version, or a full snapshot every ``full_sync_every``
publications (and whenever there is no previous version to diff against), put in the server's
``depot`` (``stage``) and pushed once along a relay chain of the workers (``relay``, through
``swarm.weights.relay.disseminate``: each forwards chunks to the next while receiving the rest, so the
server uploads about one copy whatever the pool size). The two are separate calls so that in async
mode the push can overlap the next step (``swarm.pool.roster``). Workers that join, or fall behind a
delta's base, load a full snapshot of the newest version from ``snapshots``, served under
``SNAPSHOT_PREFIX`` by the same relay routes.

It keeps a CPU copy of the newest weights only while the pool has remote members (the base of the
next delta and of snapshots); without workers it holds nothing and a joiner's snapshot is taken
from the trainer through ``export``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.weights.base import Weights, WeightTransport

if TYPE_CHECKING:
    import torch

    from swarm.weights.shards import Manifest

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "/pool/full"  # the server mounts the relay routes of its snapshot depot under this prefix

Export = Callable[[], Awaitable[tuple[int, Weights]]]  # (version, a private CPU copy of its weights)


@dataclass
class Encoded:
    """A version put in the depots, ready to relay."""

    version: int
    kind: str
    total_bytes: int
    started: float  # perf_counter() when its encoding began: a publication's time counts from there


@dataclass
class Sent:
    """What one publication did: how it was encoded, how long the chain took, who got it."""

    version: int
    kind: str
    seconds: float
    bytes_sent: int
    total_bytes: int
    reached: list[str]
    failed: list[str]


class Publisher(WeightTransport[Encoded]):
    """Encodes versions into the depots (``stage``) and relays them to the workers (``relay``, its
    delivery): the pool's ``WeightTransport`` (module docstring)."""

    kind = "relay"

    def __init__(self, token: str, *, export: Export | None = None, rate_bytes_per_s: float | None = None,
                 chunk_bytes: int = 1 << 20) -> None:
        from swarm.weights.relay import Depot

        self.token = token
        self.export = export
        self.rate_bytes_per_s = rate_bytes_per_s
        self.chunk_bytes = chunk_bytes
        self.depot = Depot(keep=4)
        self.snapshots = Depot(keep=2)
        self._base: tuple[int, Weights] | None = None
        self._since_full = 0
        self._lock = asyncio.Lock()  # encoding and the base copy
        self._relaying = asyncio.Lock()

    @property
    def base_version(self) -> int | None:
        return self._base[0] if self._base is not None else None

    def reset(self) -> None:
        """No remote member left: drop the CPU copy (the next joiner's snapshot comes from ``export``,
        the next version goes out in full)."""
        self._base = None

    def can_follow(self, held: int | None, newest: int) -> bool:
        """Whether a worker holding ``held`` can load ``newest`` from the depot (it is full there, or
        a delta over ``held``); if not it needs a snapshot."""
        entry = self.depot.get(newest)
        if held is None or entry is None:
            return False
        manifest = entry[0]
        return manifest.kind == "full" or manifest.base_version == held

    def full_next(self, version: int, full_sync_every: int) -> bool:
        """Whether ``version`` goes out as a full snapshot (else a delta over ``base_version``)."""
        return self._base is None or self._since_full + 1 >= full_sync_every or self._base[0] >= version

    async def stage(self, version: int, weights: Weights | None, full: bool = False) -> Encoded:
        """Put ``version`` in the depots (full, or a delta over ``base_version``) and keep a private
        copy as the next base: once this returns, the trainer may change ``weights``."""
        if weights is None:
            raise ValueError("the relay encodes the weights it is given (export a streamed version first)")
        async with self._lock:
            started = time.perf_counter()
            full = full or self._base is None
            manifest, chunks, copy = await asyncio.to_thread(self._encode_and_copy, version, weights, full)
            self.depot.put(manifest, chunks)
            if full:
                self.snapshots.put(manifest, chunks)
            self._since_full = 0 if full else self._since_full + 1
            self._base = (version, copy)
            return Encoded(version=version, kind=manifest.kind, total_bytes=int(manifest.total_bytes),
                           started=started)

    async def relay(self, encoded: Encoded, chain: list[str], timeout_s: float = 120.0) -> Sent:
        """Push an encoded version along ``chain`` (one push at a time: they share the upload)."""
        from swarm.weights.relay import disseminate

        async with self._relaying:
            reached: list[str] = []
            failed: list[str] = []
            sent = 0
            if chain:
                report = await disseminate(self.depot, encoded.version, chain, token=self.token,
                                           rate_bytes_per_s=self.rate_bytes_per_s, timeout_s=timeout_s)
                reached, failed, sent = list(report.reached), list(report.failed), int(report.bytes_sent)
            return Sent(version=encoded.version, kind=encoded.kind, seconds=time.perf_counter() - encoded.started,
                        bytes_sent=sent, total_bytes=encoded.total_bytes, reached=reached, failed=failed)

    async def snapshot(self) -> int | None:
        """The version ``snapshots`` holds in full, encoding the newest one first if it does not
        (from the CPU copy, or the trainer's export when there is none); None: nothing to serve yet."""
        async with self._lock:
            if self._base is None:
                if self.export is None:
                    return None
                version, weights = await self.export()
                self._base = (version, weights)  # ``export`` hands over a private copy
                self._since_full = 0
            version, weights = self._base
            if version not in self.snapshots.versions():
                manifest, chunks = await asyncio.to_thread(self._encode, version, weights, True)
                self.snapshots.put(manifest, chunks)
                if version not in self.depot.versions():
                    self.depot.put(manifest, chunks)
            return version

    def _encode(self, version: int, weights: Weights, full: bool) -> tuple[Manifest, list[bytes]]:
        from swarm.weights.shards import encode

        base = None if full or self._base is None else self._base
        return encode(version, weights, base=base, chunk_bytes=self.chunk_bytes)

    def _encode_and_copy(self, version: int, weights: Weights,
                         full: bool) -> tuple[Manifest, list[bytes], dict[str, torch.Tensor]]:
        manifest, chunks = self._encode(version, weights, full)
        return manifest, chunks, cpu_copy(weights)


def cpu_copy(weights: Weights) -> dict[str, torch.Tensor]:
    """A private CPU copy (the trainer's export may share storage with parameters it keeps training)."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}
