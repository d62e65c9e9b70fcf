"""``WorkerNode``: the insides of a ``swarm worker`` process — one generator serving a server's pool.

The process hosts ``POST /pool/v1/generate`` (token ids + sampling params in; rows, log-probs and the
version that produced them out, as NDJSON token lines when asked), the relay routes with an
``Inbox`` (it receives each new version from its predecessor in the chain and forwards it to the
next) and ``GET /pool/v1/health``. Its life with the server:

1. join (``POST /api/v1/workers``): the answer names the newest version; it pulls that version's
   full snapshot from the server (``relay.fetch``), loads it, and only then heartbeats a version,
   which is what makes the server route calls to it;
2. heartbeat every ``heartbeat_s`` (version, rows in flight, tokens/s); the answer names the newest
   version, and a worker behind it catches up: the delta from the server's depot when it holds the
   delta's base (the manifest from the server, the chunks from the peers the answer names, which
   hold that version, where they can), else the full snapshot;
3. on SIGTERM it leaves (``DELETE``; the server sends no new calls), lets running calls finish, and
   exits. A worker that stops heartbeating is dropped by the server; a 404 heartbeat (dropped while
   alive, e.g. a long pause) makes it join again.

It keeps a CPU copy of the weights it serves: the base the next delta applies to. ``max_tokens_per_s``
caps its generation rate (a pace over produced tokens; benchmarks emulate equal slow workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.backends.base import Generator, Sampled, SamplingParams, TopAlternatives, Weights
from swarm.pool.wire import (
    GENERATE_PATH,
    HEALTH_PATH,
    WORKERS_PATH,
    Beat,
    BeatReply,
    GenerateRequest,
    GenerateResult,
    Join,
    Joined,
    StreamLine,
    WorkerHealth,
)
from swarm.weights.publish import SNAPSHOT_PREFIX
from swarm.weights.relay import Depot, Inbox, fetch, relay_router
from swarm.weights.shards import Manifest, decode

log = logging.getLogger(__name__)


@dataclass
class WorkerOptions:
    server: str  # the swarm server's base URL
    token: str  # the worker token
    engine: str  # torch or vllm (what the server lists)
    capacity: int
    model: str = ""
    advertise: str | None = None  # the URL the server reaches this worker at (default: its bound address)
    max_tokens_per_s: float | None = None


class WorkerNode:
    """One worker: its generator, the weights it holds, its membership (module docstring)."""

    def __init__(self, generator: Generator, options: WorkerOptions) -> None:
        self.generator = generator
        self.options = options
        self.server = options.server.rstrip("/")
        self.address: str | None = options.advertise
        self.version: int | None = None
        self.weights: Weights | None = None
        self.worker_id: str | None = None
        self.in_flight = 0
        self.produced_total = 0  # tokens generated since start (health; benchmarks)
        self.leaving = False
        self.listening = asyncio.Event()
        self.depot = Depot(keep=2)
        self.inbox = Inbox(self.depot, on_version=self.apply, token=options.token, sources=lambda: [self.server])
        self._load_lock = asyncio.Lock()
        self._pace = _Pace(options.max_tokens_per_s) if options.max_tokens_per_s else None
        self._produced: deque[tuple[float, int]] = deque()
        self._http = httpx.AsyncClient(base_url=self.server, timeout=60.0,
                                       headers={"Authorization": f"Bearer {options.token}"})
        self._heartbeat_s = 2.0
        self._syncing: asyncio.Future[None] | None = None
        self._announcing: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references to tasks

    # ------------------------------------------------------------------ weights

    async def apply(self, manifest: Manifest, chunks: list[bytes]) -> None:
        """Load a verified version (a delta needs the version it was made over: ``ShardError`` else)."""
        async with self._load_lock:
            if self.version is not None and manifest.version <= self.version:
                return
            base: tuple[int, Weights] | None = None
            if manifest.kind == "delta" and self.version is not None and self.weights is not None:
                base = (self.version, self.weights)
            weights = await asyncio.to_thread(decode, manifest, chunks, base)
            await self.generator.load_weights(manifest.version, weights)
            self.weights, self.version = weights, manifest.version
        log.info("holding policy version %d (%s, %d bytes)", manifest.version, manifest.kind, manifest.total_bytes)
        announce = asyncio.ensure_future(self._announce())  # the server may route to it at once
        self._announcing.add(announce)
        announce.add_done_callback(self._announcing.discard)

    async def catch_up(self, newest: int | None, snapshot: int | None, peers: Sequence[str] = ()) -> None:
        """Behind ``newest``: the delta when it applies to what is held (its chunks from ``peers`` that
        hold it, where they can), else the full snapshot."""
        if newest is None or (self.version is not None and self.version >= newest):
            return
        try:
            manifest, chunks = await fetch(self.server, newest, token=self.options.token, client=self._http,
                                           peers=peers)
            if manifest.kind == "full" or manifest.base_version == self.version:
                await self.apply(manifest, chunks)
                return
        except (httpx.HTTPError, ValueError) as exc:
            log.info("version %d is not in the server's depot as a usable delta (%s); loading a snapshot", newest, exc)
        if snapshot is not None and (self.version is None or snapshot > self.version):
            manifest, chunks = await fetch(self.server + SNAPSHOT_PREFIX, snapshot, token=self.options.token,
                                           client=self._http)
            await self.apply(manifest, chunks)

    # ------------------------------------------------------------------ membership

    async def run(self) -> None:
        """Join, sync, heartbeat until leaving (a task for the process's life)."""
        await self.listening.wait()
        while not self.leaving:
            try:
                if self.worker_id is None:
                    await self._join()
                reply = await self._beat_once()
                if reply is not None:
                    self._sync(reply.version, reply.snapshot_version, reply.peers)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code == 404:  # dropped while alive: join again
                    log.warning("the server no longer knows this worker; joining again")
                    self.worker_id = None
                    continue
                log.warning("heartbeat refused: %s", exc.response.text[:300])
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("server %s unreachable or sync failed: %s", self.server, exc)
            await asyncio.sleep(self._heartbeat_s)

    async def _join(self) -> None:
        body = Join(engine=self.options.engine, address=self.address or "", capacity=self.options.capacity,
                    model=self.options.model)
        answer = await self._http.post(WORKERS_PATH, content=body.model_dump_json(),
                                       headers={"Content-Type": "application/json"})
        answer.raise_for_status()
        joined = Joined.model_validate(answer.json())
        self.worker_id, self._heartbeat_s = joined.worker_id, joined.heartbeat_s
        log.info("joined %s as %s; syncing to version %s", self.server, joined.worker_id, joined.version)
        self._sync(joined.version, joined.version)

    def _sync(self, newest: int | None, snapshot: int | None, peers: Sequence[str] = ()) -> None:
        """Catch up in the background (one pull at a time): heartbeats go on while a big model loads."""
        if newest is None or (self.version is not None and self.version >= newest):
            return
        if self._syncing is not None and not self._syncing.done():
            return
        self._syncing = asyncio.ensure_future(self._catch_up_logged(newest, snapshot, peers))

    async def _catch_up_logged(self, newest: int, snapshot: int | None, peers: Sequence[str]) -> None:
        try:
            await self.catch_up(newest, snapshot, peers)
        except (httpx.HTTPError, ValueError) as exc:  # the next heartbeat tries again
            log.warning("catching up to version %d failed: %s", newest, exc)

    async def _announce(self) -> None:
        try:
            await self._beat_once()
        except (httpx.HTTPError, ValueError) as exc:  # the regular heartbeat tries again
            log.info("heartbeat after loading failed: %s", exc)

    async def _beat_once(self) -> BeatReply | None:
        if self.worker_id is None or self.leaving:
            return None
        beat = Beat(version=self.version, in_flight=self.in_flight, tokens_per_s=self.tokens_per_s())
        answer = await self._http.post(f"{WORKERS_PATH}/{self.worker_id}/heartbeat", content=beat.model_dump_json(),
                                       headers={"Content-Type": "application/json"})
        answer.raise_for_status()
        return BeatReply.model_validate(answer.json())

    async def leave(self, grace_s: float = 60.0) -> None:
        """No new calls from the server; wait (bounded) for the running ones to finish."""
        self.leaving = True
        if self.worker_id is not None:
            with contextlib.suppress(httpx.HTTPError):
                await self._http.delete(f"{WORKERS_PATH}/{self.worker_id}")
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ generation

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        while self._produced and self._produced[0][0] < now - 10.0:
            self._produced.popleft()
        return sum(n for _, n in self._produced) / 10.0

    async def generate(self, prompts: list[list[int]], params: list[SamplingParams], sink: Any = None) -> Sampled:
        self.in_flight += len(prompts)
        started = time.monotonic()
        try:
            sampled = await self.generator.generate(prompts, params, sink)
            produced = sum(len(g.token_ids) for g in sampled.generations)
            if self._pace is not None:
                await self._pace.pay(produced, started)  # the --max-tokens-per-s cap
        finally:
            self.in_flight -= len(prompts)
        self._produced.append((time.monotonic(), produced))
        self.produced_total += produced
        return sampled

    def authorize(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        if header != f"Bearer {self.options.token}":
            raise HTTPException(401, "this worker takes calls with its pool's worker token only")

    async def close(self) -> None:
        await self.inbox.aclose()
        await self._http.aclose()


class _Pace:
    """``--max-tokens-per-s``: on average at most ``rate`` tokens a second. A call that produced ``n``
    tokens returns no earlier than ``n / rate`` seconds after the later of its own start and the moment
    the tokens before it were paid for, so time spent generating counts towards the pace."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._paid = 0.0

    async def pay(self, tokens: int, started: float) -> None:
        self._paid = max(self._paid, started) + tokens / self.rate
        delay = self._paid - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def worker_app(node: WorkerNode) -> FastAPI:
    """The worker's HTTP surface (module docstring); its lifespan starts the generator and membership."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await node.generator.start()
        task = asyncio.create_task(node.run(), name="swarm-worker-membership")
        try:
            yield
        finally:
            if not node.leaving:
                await node.leave(grace_s=0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await node.close()
            await node.generator.close()

    app = FastAPI(title="swarm worker", version="1", lifespan=lifespan)
    app.include_router(relay_router(node.depot, node.inbox, node.authorize))

    @app.get(HEALTH_PATH)
    async def health() -> WorkerHealth:
        return WorkerHealth(worker_id=node.worker_id, version=node.version, in_flight=node.in_flight,
                            produced_tokens=node.produced_total, leaving=node.leaving, engine=node.options.engine)

    @app.post(GENERATE_PATH, response_model=None)
    async def generate(body: GenerateRequest, request: Request) -> Any:
        node.authorize(request)
        if node.version is None or node.leaving:
            state = "leaving" if node.leaving else "still syncing (no version loaded)"
            return JSONResponse({"error": {"code": "retry_later", "message": f"this worker is {state}"}}, 503)
        if len(body.prompts) != len(body.params):
            return JSONResponse({"error": {"code": "bad_request", "message": "one params entry per prompt"}}, 422)
        params = [p.sampling() for p in body.params]
        if not body.stream:
            try:
                return GenerateResult.of(await node.generate(body.prompts, params))
            except ValueError as exc:
                return JSONResponse({"error": {"code": "bad_request", "message": str(exc)}}, 400)
        return StreamingResponse(_stream(node, body.prompts, params), media_type="application/x-ndjson")

    return app


async def _stream(node: WorkerNode, prompts: list[list[int]], params: list[SamplingParams]) -> AsyncIterator[str]:
    """NDJSON: one line per token as sampled, then the result (or an error line)."""
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def sink(row: int, token: int, logprob: float, top: TopAlternatives | None) -> None:
        lines.put_nowait(StreamLine(t=(row, token, logprob, top)).model_dump_json(exclude_none=True) + "\n")

    async def run() -> None:
        try:
            sampled = await node.generate(prompts, params, sink)
            lines.put_nowait(StreamLine(done=GenerateResult.of(sampled)).model_dump_json(exclude_none=True) + "\n")
        except ValueError as exc:
            lines.put_nowait(StreamLine(error=str(exc), status=400).model_dump_json(exclude_none=True) + "\n")
        except Exception as exc:  # reported to the server, which re-runs the rows elsewhere
            log.exception("generation failed")
            lines.put_nowait(StreamLine(error=f"{type(exc).__name__}: {exc}", status=500)
                             .model_dump_json(exclude_none=True) + "\n")
        finally:
            lines.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        while (line := await lines.get()) is not None:
            yield line
    finally:
        if not task.done():
            task.cancel()
