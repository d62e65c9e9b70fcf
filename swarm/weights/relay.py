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
from pydantic import BaseModel

from swarm.weights.bucket import TokenBucket
from swarm.weights.chain import (
    PREFIX,
    REQUEST_TIMEOUT_S,
    Depot,
    Forward,
    Holding,
    HopReport,
    Opened,
    OpenPush,
    Stored,
    cancel_holding,
    get_chunk,
)
from swarm.weights.shards import ChunkInfo, Manifest, ShardError, verify_chunk

__all__ = ["Depot", "Inbox", "RelayReport", "disseminate", "fetch", "relay_router"]

log = logging.getLogger(__name__)

_KEEP_HOLDINGS = 4  # versions an Inbox remembers receiving (for the reports of pushes that finished)


class RelayReport(BaseModel):
    """What one ``disseminate`` achieved: ``bytes_sent`` is this node's own upload."""

    version: int
    seconds: float
    bytes_sent: int
    reached: list[str]
    failed: list[str]


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
        self._holdings: dict[int, Holding] = {}
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.refetched = 0

    async def aclose(self) -> None:
        """Stop pushes under way and close the HTTP client (on the node's shutdown)."""
        for holding in self._holdings.values():
            cancel_holding(holding)
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

    def _open(self, push: OpenPush) -> list[int]:
        """Start (or join) receiving ``push.manifest.version``; start forwarding to ``push.chain``."""
        version = push.manifest.version
        holding = self._holdings.get(version)
        if holding is None:
            held = self._depot.get(version)
            holding = Holding(held[0] if held else push.manifest, held[1] if held else None)
        if holding.manifest != push.manifest:
            if holding.applied:  # another encoding of a version this node already serves
                raise HTTPException(409, f"version {version} is held here from another manifest "
                                         f"({holding.manifest.kind} over {holding.manifest.base_version})")
            cancel_holding(holding)  # an unfinished (or unusable) encoding: the new push replaces it
            holding = Holding(push.manifest)
        self._holdings[version] = holding
        for old in sorted(self._holdings)[:-_KEEP_HOLDINGS]:
            cancel_holding(self._holdings.pop(old))
        holding.deadline = max(holding.deadline, time.monotonic() + push.timeout_s)
        if not holding.applied and (holding.settle is None or holding.settle.done()):
            holding.settle = asyncio.create_task(self._settle(holding))
        if holding.forward is None or holding.forward.done():
            forward = Forward(holding, self._http(), self._token, self._bucket)
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

    async def _report(self, version: int) -> HopReport:
        holding = self._holding(version)
        waits = [task for task in (holding.settle, holding.forward) if task is not None]
        if waits:
            await asyncio.wait(waits, timeout=max(0.0, holding.deadline - time.monotonic()) + 0.5)
        forward = holding.forward
        if forward is not None and forward.done() and not forward.cancelled() and forward.exception() is None:
            reached, failed = forward.result()
        else:  # did not finish by the deadline: nobody downstream confirmed
            reached, failed = [], list(holding.chain)
        return HopReport(holds=holding.applied, reached=reached, failed=failed)

    def _holding(self, version: int) -> Holding:
        holding = self._holdings.get(version)
        if holding is None:
            raise HTTPException(409, f"no push of version {version} is open here: "
                                     f"POST {PREFIX}/versions/{version} first")
        return holding

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S)
        return self._client

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, holding: Holding) -> None:
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

    async def _repair(self, holding: Holding, index: int) -> None:
        """Fetch chunk ``index`` from the first source that has a good copy."""
        version = holding.manifest.version
        for source in self._sources():
            try:
                data = await get_chunk(self._http(), source, version, index, self._token)
                holding.offer(index, data)
            except (httpx.HTTPError, ShardError) as exc:
                log.warning("version %d: chunk %d from %s: %s", version, index, source, exc)
                continue
            self.refetched += 1
            return
        log.error("version %d: no source had a good chunk %d; waiting for a re-push", version, index)


def relay_router(depot: Depot, inbox: Inbox | None, authorize: Callable[[Request], object]) -> APIRouter:
    """The ``/pool/v1`` routes of one node. ``inbox=None`` (the server): only the catch-up GETs."""

    async def _authorized(request: Request) -> None:  # async: FastAPI would run a plain def in a thread
        authorize(request)

    router = APIRouter(prefix=PREFIX, dependencies=[Depends(_authorized)], tags=["pool"])

    def _held(version: int) -> tuple[Manifest, Callable[[int], bytes | None]]:
        held = depot.get(version)
        if held is not None:
            manifest, chunks = held
            return manifest, lambda i: chunks[i] if 0 <= i < len(chunks) else None
        found = inbox.manifest(version) if inbox is not None else None
        if inbox is None or found is None:
            raise HTTPException(404, f"version {version} is not held here")
        return found, lambda i: inbox.chunk(version, i)

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
    async def open_push(version: int, push: OpenPush) -> Opened:
        if push.manifest.version != version:
            raise HTTPException(400, f"the manifest is of version {push.manifest.version}, not {version}")
        return Opened(missing=inbox._open(push))

    @router.put("/versions/{version}/chunks/{index}")
    async def put_chunk(version: int, index: int, request: Request) -> Stored:
        limit = inbox._chunk_size(version, index)
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise HTTPException(413, f"chunk {index} is {limit} bytes; more was sent")
        return Stored(kept=inbox._store(version, index, bytes(body)))

    @router.get("/versions/{version}/report")
    async def report(version: int) -> HopReport:
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
    http = client or httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S)
    try:
        forward = Forward(Holding(*held), http, token, bucket or TokenBucket(rate_bytes_per_s))
        reached, failed = await forward.run(members, started + timeout_s)
    finally:
        if client is None:
            await http.aclose()
    return RelayReport(version=version, seconds=time.monotonic() - started, bytes_sent=forward.sent,
                       reached=reached, failed=failed)


async def fetch(source: str, version: int, *, token: str, client: httpx.AsyncClient | None = None,
                peers: Sequence[str] = ()) -> tuple[Manifest, list[bytes]]:
    """Pull ``version``: its manifest from ``source`` (a worker or the server), then each chunk,
    verified against that manifest. With ``peers`` (workers that hold the version) chunk i comes
    from peer i mod len(peers), which takes the load off the server; a chunk a peer does not hold or
    serves wrong comes from ``source``. A bad chunk from ``source`` is fetched once more, then
    ``ShardError``. A source that does not hold the version answers 404 (``httpx.HTTPStatusError``)."""
    http = client or httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S)
    source = source.rstrip("/")
    try:
        answer = await http.get(f"{source}{PREFIX}/versions/{version}/manifest",
                                headers={"Authorization": f"Bearer {token}"})
        answer.raise_for_status()
        manifest = Manifest.model_validate(answer.json())
        chunks = []
        for info in manifest.chunks:
            data = await _from_peer(http, peers[info.index % len(peers)], version, info, token) if peers else None
            if data is None:
                data = await get_chunk(http, source, version, info.index, token)
                try:
                    verify_chunk(info, data)
                except ShardError as exc:
                    log.warning("version %d from %s: %s; fetching it once more", version, source, exc)
                    data = await get_chunk(http, source, version, info.index, token)
                    verify_chunk(info, data)
            chunks.append(data)
        return manifest, chunks
    finally:
        if client is None:
            await http.aclose()


async def _from_peer(http: httpx.AsyncClient, peer: str, version: int, info: ChunkInfo, token: str) -> bytes | None:
    """Chunk ``info`` of ``version`` from ``peer``, verified; None when it does not hold it or serves it wrong
    (it may hold the version in another encoding, or have left)."""
    try:
        data = await get_chunk(http, peer, version, info.index, token)
        verify_chunk(info, data)
        return data
    except (httpx.HTTPError, ShardError) as exc:
        log.info("chunk %d of version %d not from peer %s (%s); from the source", info.index, version, peer, exc)
        return None
