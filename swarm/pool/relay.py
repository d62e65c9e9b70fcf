"""The relay chain: a new policy version reaches every worker for about one upload from the server.

``disseminate`` pushes a version the server's ``Depot`` holds to ``chain[0]``, telling it the rest
of the chain; that worker forwards each chunk to ``chain[1]`` as soon as the chunk has arrived and
passed its SHA-256, while the next chunk is still coming in, and so on down the chain (SHARDCAST's
shards, ECHO-2's pipelined broadcast). With ``n`` chunks and ``K`` members the last one holds the
version after about ``n + K - 1`` chunk times at the per-sender bandwidth ``B``: ``S/B`` plus a few
chunks, whatever ``K``, and every node uploads about one copy.

Transport: plain HTTP/1.1 between the members, one request per chunk, up to ``WINDOW`` in flight per
hop. One request per chunk (rather than one long streaming request per hop) keeps each body under
the server's body limit, lets a re-push send only the chunks a member is missing, makes every
failure a plain failed request, and gives a clean 401/403 when a token is wrong; the window hides the
round trip of each request, so a hop's link never idles. Each sender shapes its upload with its own
``TokenBucket``.

Per version, a node's routes (``relay_router``, all under ``/pool/v1``, every one behind
``authorize``):

- ``POST /versions/{v}`` {manifest, chain, timeout_s} opens a push (or joins the one under way) and
  answers {missing: [chunk indices]}; the node starts forwarding to ``chain`` at once;
- ``PUT /versions/{v}/chunks/{i}`` one chunk's bytes; answers {kept}: a chunk failing its hash is
  not kept, and the node fetches it again from its ``sources`` (its predecessor, then the server);
- ``GET /versions/{v}/report`` waits until the node holds and has applied the version (or its
  deadline passed) and its own forwarding is done: {holds, reached, failed} for itself and downstream;
- ``GET /versions``, ``GET /versions/{v}/manifest``, ``GET /versions/{v}/chunks/{i}``: what the node
  holds, for catch-up pulls (``fetch``) and repairs; a chunk still arriving is served once verified.

Faults: a member that refuses, fails a request, or dies mid-push is put in ``failed`` by its
predecessor, which goes on with the next member (opening it, sending the chunks it lacks, waiting for
its report), so the rest still get the version. A member whose ``on_version`` fails (a delta without
its base) still relays the chunks but reports that it does not hold the version, and a later push of
another encoding (a full snapshot) replaces the unusable one; a push of a version the node already
applied from another manifest is a 409, an unknown version a 404.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import BaseModel, Field

from swarm.pool.bucket import TokenBucket
from swarm.pool.shards import Manifest, ShardError, verify_chunk

log = logging.getLogger(__name__)

PREFIX = "/pool/v1"
WINDOW = 2  # chunk requests in flight per hop
_REQUEST_TIMEOUT_S = 30.0  # one chunk request or one manifest
_KEEP_HOLDINGS = 4  # versions an Inbox remembers receiving (for the reports of pushes that finished)


class RelayReport(BaseModel):
    """What one ``disseminate`` achieved: ``bytes_sent`` is this node's own upload."""

    version: int
    seconds: float
    bytes_sent: int
    reached: list[str]
    failed: list[str]


class _Open(BaseModel):
    """``POST /pool/v1/versions/{v}``: the version's manifest and who the receiver forwards it to."""

    manifest: Manifest
    chain: list[str]
    timeout_s: float = Field(gt=0)


class _Opened(BaseModel):
    missing: list[int]


class _Stored(BaseModel):
    kept: bool


class _Hop(BaseModel):
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


class _Holding:
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


class _Forward:
    """Send one held (or arriving) version down a chain: open the next member, send it the chunks
    it lacks in order as they arrive here, wait for its report; on any failure, skip to the member
    after it."""

    def __init__(self, holding: _Holding, client: httpx.AsyncClient, token: str, bucket: TokenBucket) -> None:
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

    async def _hop(self, target: str, rest: list[str], remaining: float) -> _Hop:
        version = self._holding.manifest.version
        # The member must report before our own deadline: leave it a margin for the answer.
        child_timeout = max(0.1, remaining * 0.95 - 0.25)
        opened = await self._client.post(
            f"{target}{PREFIX}/versions/{version}", headers=self._headers, timeout=_REQUEST_TIMEOUT_S,
            json=_Open(manifest=self._holding.manifest, chain=rest, timeout_s=child_timeout).model_dump(mode="json"))
        opened.raise_for_status()
        await self._send(target, _Opened.model_validate(opened.json()).missing)
        report = await self._client.get(f"{target}{PREFIX}/versions/{version}/report", headers=self._headers,
                                        timeout=remaining + 1.0)
        report.raise_for_status()
        return _Hop.model_validate(report.json())

    async def _send(self, target: str, indices: list[int]) -> None:
        """Chunks ``indices`` in order, each once it is here, at most ``WINDOW`` requests in flight."""
        in_flight: set[asyncio.Task[None]] = set()
        try:
            for index in indices:
                await self._holding.arrived[index].wait()
                while len(in_flight) >= WINDOW:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    _raise_first(done)
                data = self._holding.chunks[index]
                assert data is not None  # arrived is set only with the chunk in place
                await self._bucket.take(len(data))
                self.sent += len(data)
                in_flight.add(asyncio.create_task(self._put(target, index, data)))
            if in_flight:
                done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_EXCEPTION)
                _raise_first(done)
        finally:
            for task in in_flight:
                task.cancel()

    async def _put(self, target: str, index: int, data: bytes) -> None:
        version = self._holding.manifest.version
        answer = await self._client.put(f"{target}{PREFIX}/versions/{version}/chunks/{index}", content=data,
                                        headers=self._headers, timeout=_REQUEST_TIMEOUT_S)
        answer.raise_for_status()
        if not _Stored.model_validate(answer.json()).kept:
            log.warning("relay of version %d: %s got chunk %d corrupted; it refetches it", version, target, index)


class Inbox:
    """A worker's receiving side: takes pushes, checks chunks, repairs bad ones from ``sources()``,
    forwards down the chain with its own upload bucket, and awaits ``on_version`` once per version
    when all of it is in and verified (the caller decodes it against its own base).
    ``refetched`` counts chunks that arrived corrupted and were fetched again."""

    def __init__(self, depot: Depot, *, on_version: Callable[[Manifest, list[bytes]], Awaitable[None]],
                 token: str, rate_bytes_per_s: float | None = None,
                 sources: Callable[[], list[str]] = lambda: []) -> None:
        self._depot = depot
        self._on_version = on_version
        self._token = token
        self._bucket = TokenBucket(rate_bytes_per_s)
        self._sources = sources
        self._holdings: dict[int, _Holding] = {}
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.refetched = 0

    async def aclose(self) -> None:
        """Stop pushes under way and close the HTTP client (on the node's shutdown)."""
        for holding in self._holdings.values():
            _cancel(holding)
        for task in self._tasks:
            task.cancel()
        if self._client is not None:
            await self._client.aclose()

    def chunk(self, version: int, index: int) -> bytes | None:
        holding = self._holdings.get(version)
        return holding.chunks[index] if holding is not None and 0 <= index < len(holding.chunks) else None

    def manifest(self, version: int) -> Manifest | None:
        holding = self._holdings.get(version)
        return holding.manifest if holding is not None else None

    def _open(self, push: _Open) -> list[int]:
        """Start (or join) receiving ``push.manifest.version``; start forwarding to ``push.chain``."""
        version = push.manifest.version
        holding = self._holdings.get(version)
        if holding is None:
            held = self._depot.get(version)
            holding = _Holding(held[0] if held else push.manifest, held[1] if held else None)
        if holding.manifest != push.manifest:
            if holding.applied:  # another encoding of a version this node already serves
                raise HTTPException(409, f"version {version} is held here from another manifest "
                                         f"({holding.manifest.kind} over {holding.manifest.base_version})")
            _cancel(holding)  # an unfinished (or unusable) encoding: the new push replaces it
            holding = _Holding(push.manifest)
        self._holdings[version] = holding
        for old in sorted(self._holdings)[:-_KEEP_HOLDINGS]:
            _cancel(self._holdings.pop(old))
        holding.deadline = max(holding.deadline, time.monotonic() + push.timeout_s)
        if not holding.applied and (holding.settle is None or holding.settle.done()):
            holding.settle = asyncio.create_task(self._settle(holding))
        if holding.forward is None or holding.forward.done():
            forward = _Forward(holding, self._http(), self._token, self._bucket)
            holding.chain = list(push.chain)
            holding.forward = asyncio.create_task(forward.run(push.chain, holding.deadline))
        return holding.missing()

    def _chunk_size(self, version: int, index: int) -> int:
        """The size the manifest gives chunk ``index`` of a version being received (409/404 if none)."""
        holding = self._holding(version)
        if not 0 <= index < len(holding.manifest.chunks):
            raise HTTPException(404, f"version {version} has no chunk {index}")
        return holding.manifest.chunks[index].size

    def _store(self, version: int, index: int, data: bytes) -> bool:
        """Keep a pushed chunk if it passes its hash; if not, fetch it again from a source."""
        holding = self._holding(version)
        try:
            holding.offer(index, data)
        except ShardError as exc:
            log.warning("version %d: %s; fetching it again", version, exc)
            self._spawn(self._repair(holding, index))
            return False
        return True

    async def _report(self, version: int) -> _Hop:
        holding = self._holding(version)
        waits = [task for task in (holding.settle, holding.forward) if task is not None]
        if waits:
            await asyncio.wait(waits, timeout=max(0.0, holding.deadline - time.monotonic()) + 0.5)
        forward = holding.forward
        if forward is not None and forward.done() and not forward.cancelled() and forward.exception() is None:
            reached, failed = forward.result()
        else:  # did not finish by the deadline: nobody downstream confirmed
            reached, failed = [], list(holding.chain)
        return _Hop(holds=holding.applied, reached=reached, failed=failed)

    def _holding(self, version: int) -> _Holding:
        holding = self._holdings.get(version)
        if holding is None:
            raise HTTPException(409, f"no push of version {version} is open here: "
                                     f"POST {PREFIX}/versions/{version} first")
        return holding

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S)
        return self._client

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, holding: _Holding) -> None:
        """Once every chunk is in: hand the version to ``on_version``, then keep it in the depot (which
        lists what this node serves; chunks of a version it could not apply are served while it is held)."""
        try:
            await asyncio.wait_for(holding.complete.wait(), max(0.0, holding.deadline - time.monotonic()))
        except TimeoutError:
            log.warning("version %d: still missing chunks %s at the deadline", holding.manifest.version,
                        holding.missing())
            return
        chunks = [data for data in holding.chunks if data is not None]
        try:
            await self._on_version(holding.manifest, chunks)
        except Exception:
            log.exception("version %d: on_version failed; this node does not count as holding it",
                          holding.manifest.version)
            return
        self._depot.put(holding.manifest, chunks)
        holding.applied = True

    async def _repair(self, holding: _Holding, index: int) -> None:
        """Fetch chunk ``index`` from the first source that has a good copy."""
        version = holding.manifest.version
        for source in self._sources():
            try:
                data = await _get_chunk(self._http(), source, version, index, self._token)
                holding.offer(index, data)
            except (httpx.HTTPError, ShardError) as exc:
                log.warning("version %d: chunk %d from %s: %s", version, index, source, exc)
                continue
            self.refetched += 1
            return
        log.error("version %d: no source had a good chunk %d; waiting for a re-push", version, index)


def relay_router(depot: Depot, inbox: Inbox | None, authorize: Callable[[Request], None]) -> APIRouter:
    """The ``/pool/v1`` routes of one node. ``inbox=None`` (the server): only the catch-up GETs."""

    async def _authorized(request: Request) -> None:  # async: FastAPI would run a plain def in a thread
        authorize(request)

    router = APIRouter(prefix=PREFIX, dependencies=[Depends(_authorized)], tags=["pool"])

    def _held(version: int) -> tuple[Manifest, Callable[[int], bytes | None]]:
        held = depot.get(version)
        if held is not None:
            manifest, chunks = held
            return manifest, lambda i: chunks[i] if 0 <= i < len(chunks) else None
        manifest = inbox.manifest(version) if inbox is not None else None
        if manifest is None:
            raise HTTPException(404, f"version {version} is not held here")
        return manifest, lambda i: inbox.chunk(version, i)  # type: ignore[union-attr]

    @router.get("/versions")
    async def versions() -> dict[str, list[int]]:
        return {"versions": depot.versions()}

    @router.get("/versions/{version}/manifest")
    async def manifest(version: int) -> Manifest:
        return _held(version)[0]

    @router.get("/versions/{version}/chunks/{index}")
    async def chunk(version: int, index: int) -> Response:
        data = _held(version)[1](index)
        if data is None:
            raise HTTPException(404, f"chunk {index} of version {version} is not held here")
        return Response(content=data, media_type="application/octet-stream")

    if inbox is None:
        return router

    @router.post("/versions/{version}")
    async def open_push(version: int, push: _Open) -> _Opened:
        if push.manifest.version != version:
            raise HTTPException(400, f"the manifest is of version {push.manifest.version}, not {version}")
        return _Opened(missing=inbox._open(push))

    @router.put("/versions/{version}/chunks/{index}")
    async def put_chunk(version: int, index: int, request: Request) -> _Stored:
        limit = inbox._chunk_size(version, index)
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise HTTPException(413, f"chunk {index} is {limit} bytes; more was sent")
        return _Stored(kept=inbox._store(version, index, bytes(body)))

    @router.get("/versions/{version}/report")
    async def report(version: int) -> _Hop:
        return await inbox._report(version)

    return router


async def disseminate(depot: Depot, version: int, chain: Sequence[str], *, token: str,
                      rate_bytes_per_s: float | None = None, client: httpx.AsyncClient | None = None,
                      timeout_s: float = 120.0, bucket: TokenBucket | None = None) -> RelayReport:
    """Push ``version`` (in ``depot``) along ``chain`` (worker base URLs) and return who holds it.

    The upload is shaped by ``bucket`` (shared, e.g. across a star of pushes) or a new bucket at
    ``rate_bytes_per_s``. Returns when every reachable member holds the version or ``timeout_s`` ran
    out; members that did not confirm are in ``failed``."""
    held = depot.get(version)
    if held is None:
        raise KeyError(f"version {version} is not in the depot")
    members = list(dict.fromkeys(url.rstrip("/") for url in chain))
    started = time.monotonic()
    http = client or httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S)
    try:
        forward = _Forward(_Holding(*held), http, token, bucket or TokenBucket(rate_bytes_per_s))
        reached, failed = await forward.run(members, started + timeout_s)
    finally:
        if client is None:
            await http.aclose()
    return RelayReport(version=version, seconds=time.monotonic() - started, bytes_sent=forward.sent,
                       reached=reached, failed=failed)


async def fetch(source: str, version: int, *, token: str,
                client: httpx.AsyncClient | None = None) -> tuple[Manifest, list[bytes]]:
    """Pull ``version`` from ``source`` (a worker or the server): its manifest, then each chunk,
    verified; a bad chunk is fetched once more, then ``ShardError``. A source that does not hold the
    version answers 404 (``httpx.HTTPStatusError``)."""
    http = client or httpx.AsyncClient(timeout=_REQUEST_TIMEOUT_S)
    source = source.rstrip("/")
    try:
        answer = await http.get(f"{source}{PREFIX}/versions/{version}/manifest",
                                headers={"Authorization": f"Bearer {token}"})
        answer.raise_for_status()
        manifest = Manifest.model_validate(answer.json())
        chunks = []
        for info in manifest.chunks:
            data = await _get_chunk(http, source, version, info.index, token)
            try:
                verify_chunk(info, data)
            except ShardError as exc:
                log.warning("version %d from %s: %s; fetching it once more", version, source, exc)
                data = await _get_chunk(http, source, version, info.index, token)
                verify_chunk(info, data)
            chunks.append(data)
        return manifest, chunks
    finally:
        if client is None:
            await http.aclose()


def _cancel(holding: _Holding) -> None:
    for task in (holding.settle, holding.forward):
        if task is not None:
            task.cancel()


def _raise_first(tasks: set[asyncio.Task[None]]) -> None:
    """Raise the first failure among finished tasks (every one's exception is retrieved, so none is
    reported as "never retrieved")."""
    errors = [task.exception() for task in tasks if not task.cancelled()]
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first


async def _get_chunk(client: httpx.AsyncClient, source: str, version: int, index: int, token: str) -> bytes:
    answer = await client.get(f"{source.rstrip('/')}{PREFIX}/versions/{version}/chunks/{index}",
                              headers={"Authorization": f"Bearer {token}"}, timeout=_REQUEST_TIMEOUT_S)
    answer.raise_for_status()
    return answer.content
