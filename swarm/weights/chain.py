"""One hop of the relay chain (``swarm.weights.relay``): the wire models of a push, the versions a node
holds (``Depot``), a version as it arrives (``Holding``), and ``Forward``, which sends a version down
the rest of the chain while it is still arriving, skipping members that fail.

Kept apart from ``relay`` (the receiving ``Inbox``, the routes, ``disseminate`` and ``fetch``) so
that each reads on its own: this module is what a sender does, ``relay`` what a node exposes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import httpx
from pydantic import BaseModel, Field

from swarm.weights.bucket import TokenBucket
from swarm.weights.shards import Manifest, verify_chunk

log = logging.getLogger(__name__)

PREFIX = "/pool/v1"
WINDOW = 2  # chunk requests in flight per hop
REQUEST_TIMEOUT_S = 30.0  # one chunk request or one manifest


class OpenPush(BaseModel):
    """``POST /pool/v1/versions/{v}``: the version's manifest and who the receiver forwards it to."""

    manifest: Manifest
    chain: list[str]
    timeout_s: float = Field(gt=0)


class Opened(BaseModel):
    missing: list[int]


class Stored(BaseModel):
    kept: bool


class HopReport(BaseModel):
    """``GET .../report``: whether the node holds (and applied) the version, and who it reached."""

    holds: bool
    reached: list[str]
    failed: list[str]


class Depot:
    """The versions this node holds (manifest and chunks), newest ``keep``, for relaying and catch-up."""

    def __init__(self, keep: int = 4) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._keep = keep
        self._held: dict[int, tuple[Manifest, list[bytes]]] = {}

    def put(self, manifest: Manifest, chunks: list[bytes]) -> None:
        if len(chunks) != len(manifest.chunks):
            raise ValueError(f"version {manifest.version}: {len(chunks)} chunks "
                             f"for a manifest of {len(manifest.chunks)}")
        self._held[manifest.version] = (manifest, list(chunks))
        for old in sorted(self._held)[:-self._keep]:
            del self._held[old]

    def get(self, version: int) -> tuple[Manifest, list[bytes]] | None:
        return self._held.get(version)

    def versions(self) -> list[int]:
        return sorted(self._held)


class Holding:
    """One version as a node receives it: verified chunks so far, and events for whoever waits on them."""

    def __init__(self, manifest: Manifest, chunks: Sequence[bytes] | None = None) -> None:
        self.manifest = manifest
        self.chunks: list[bytes | None] = list(chunks) if chunks is not None else [None] * len(manifest.chunks)
        self.arrived = [asyncio.Event() for _ in self.chunks]
        self.complete = asyncio.Event()
        for index, data in enumerate(self.chunks):
            if data is not None:
                self.arrived[index].set()
        if all(self.arrived_flags()):
            self.complete.set()
        self.applied = chunks is not None  # held before this push: on_version ran already
        self.settle: asyncio.Task[None] | None = None
        self.forward: asyncio.Task[tuple[list[str], list[str]]] | None = None
        self.chain: list[str] = []  # who ``forward`` sends to
        self.deadline = time.monotonic()

    def arrived_flags(self) -> list[bool]:
        return [data is not None for data in self.chunks]

    def missing(self) -> list[int]:
        return [index for index, data in enumerate(self.chunks) if data is None]

    def offer(self, index: int, data: bytes) -> None:
        """Keep ``data`` as chunk ``index``; ``ShardError`` (nothing kept) if it fails its size or hash."""
        if self.chunks[index] is not None:
            return
        verify_chunk(self.manifest.chunks[index], data)
        self.chunks[index] = data
        self.arrived[index].set()
        if all(self.arrived_flags()):
            self.complete.set()


class Forward:
    """Send one held (or arriving) version down a chain: open the next member, send it the chunks
    it lacks in order as they arrive here, wait for its report; on any failure, skip to the member
    after it."""

    def __init__(self, holding: Holding, client: httpx.AsyncClient, token: str, bucket: TokenBucket) -> None:
        self._holding = holding
        self._client = client
        self._headers = {"Authorization": f"Bearer {token}"}
        self._bucket = bucket
        self.sent = 0
        self.reached: list[str] = []
        self.failed: list[str] = []

    async def run(self, chain: Sequence[str], deadline: float) -> tuple[list[str], list[str]]:
        queue = list(chain)
        while queue:
            target, rest = queue[0], queue[1:]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.failed.extend(queue)
                break
            try:
                async with asyncio.timeout(remaining):
                    hop = await self._hop(target, rest, remaining)
            except TimeoutError:
                log.warning("relay of version %d: %s did not report in time", self._holding.manifest.version, target)
                self.failed.extend(queue)  # nobody after it confirmed either
                break
            except (httpx.HTTPError, ValueError) as exc:  # refused, died, or answered nonsense
                log.warning("relay of version %d: %s failed (%s: %s); going on with the next member",
                            self._holding.manifest.version, target, type(exc).__name__, exc)
                self.failed.append(target)
                queue = rest
                continue
            (self.reached if hop.holds else self.failed).append(target)
            self.reached += hop.reached
            self.failed += hop.failed
            break
        return self.reached, self.failed

    async def _hop(self, target: str, rest: list[str], remaining: float) -> HopReport:
        version = self._holding.manifest.version
        # The member must report before our own deadline: leave it a margin for the answer.
        child_timeout = max(0.1, remaining * 0.95 - 0.25)
        opened = await self._client.post(
            f"{target}{PREFIX}/versions/{version}", headers=self._headers, timeout=REQUEST_TIMEOUT_S,
            json=OpenPush(manifest=self._holding.manifest, chain=rest, timeout_s=child_timeout).model_dump(mode="json"))
        opened.raise_for_status()
        await self._send(target, Opened.model_validate(opened.json()).missing)
        report = await self._client.get(f"{target}{PREFIX}/versions/{version}/report", headers=self._headers,
                                        timeout=remaining + 1.0)
        report.raise_for_status()
        return HopReport.model_validate(report.json())

    async def _send(self, target: str, indices: list[int]) -> None:
        """Chunks ``indices`` in order, each once it is here, at most ``WINDOW`` requests in flight."""
        in_flight: set[asyncio.Task[None]] = set()
        try:
            for index in indices:
                await self._holding.arrived[index].wait()
                while len(in_flight) >= WINDOW:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    raise_first(done)
                data = self._holding.chunks[index]
                assert data is not None  # arrived is set only with the chunk in place
                await self._bucket.take(len(data))
                self.sent += len(data)
                in_flight.add(asyncio.create_task(self._put(target, index, data)))
            if in_flight:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_EXCEPTION)
                raise_first(done)
        finally:
            for task in in_flight:
                task.cancel()

    async def _put(self, target: str, index: int, data: bytes) -> None:
        version = self._holding.manifest.version
        answer = await self._client.put(f"{target}{PREFIX}/versions/{version}/chunks/{index}", content=data,
                                        headers=self._headers, timeout=REQUEST_TIMEOUT_S)
        answer.raise_for_status()
        if not Stored.model_validate(answer.json()).kept:
            log.warning("relay of version %d: %s got chunk %d corrupted; it refetches it", version, target, index)


def cancel_holding(holding: Holding) -> None:
    for task in (holding.settle, holding.forward):
        if task is not None:
            task.cancel()


def raise_first(tasks: set[asyncio.Task[None]]) -> None:
    """Raise the first failure among finished tasks (every one's exception is retrieved, so none is
    reported as "never retrieved")."""
    errors = [task.exception() for task in tasks if not task.cancelled()]
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first


async def get_chunk(client: httpx.AsyncClient, source: str, version: int, index: int, token: str) -> bytes:
    answer = await client.get(f"{source.rstrip('/')}{PREFIX}/versions/{version}/chunks/{index}",
                              headers={"Authorization": f"Bearer {token}"}, timeout=REQUEST_TIMEOUT_S)
    answer.raise_for_status()
    return answer.content
