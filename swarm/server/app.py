"""``create_app(settings, backend)``: the FastAPI application around one core.

The core is composed of a generator and a trainer (``swarm.backends.base``). The factory takes
them ready-made so tests and tools drive the real code path with any model: either one ``backend``
that plays both roles (the default torch engine: one model, one device thread), or an explicit
``generator=`` and ``trainer=`` pair; ``serve`` builds them from settings. Building the app opens the state dir's durable buffer
(``buffer.db``) and checkpoints and resumes from them (``swarm.server.durability.recovery``). The app's
lifespan starts the device thread and the generator, publishes the trainer's (restored) weights to
the generator when they differ, starts the core's training loop and the lease sweeper, and stops
them in reverse order. Events go to an ``EventBus`` persisted in the buffer, so ids continue across
restarts and ``GET /api/v1/events`` can resume with ``Last-Event-ID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from swarm.backends.base import Generator, InProcessModel, Trainer
from swarm.backends.noise import KeyedNoise
from swarm.config import ServerSettings
from swarm.local.device_worker import DeviceWorker
from swarm.local.generator import LocalGenerator
from swarm.pool.pool import GeneratorPool
from swarm.pool.roster import Roster
from swarm.protocol import ChatCompletion
from swarm.server.auth import (
    KeyRing,
    load_or_create_secret,
    require_control,
    resolve_client_token,
    resolve_token,
    resolve_worker_token,
)
from swarm.server.core import ModelRoles, ServerCore, Storage
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.diskspace import DiskMonitor, QuietEventLog
from swarm.server.durability.recovery import Restored, restore
from swarm.server.durability.store import EpisodeStore
from swarm.server.episodes.lifecycle import Lifecycle
from swarm.server.errors import ERROR_RESPONSES, BodyLimitMiddleware, install_error_handlers
from swarm.server.events import SSE_EVENT_SCHEMA, EventBus, events_router
from swarm.server.http.context import AppContext
from swarm.server.http.routes_control import router as control_router
from swarm.server.http.routes_episodes import router as episodes_router
from swarm.server.http.routes_openai import router as openai_router
from swarm.server.http.routes_workers import router as workers_router
from swarm.server.mlflow_sink import ServerRun
from swarm.server.training.trainer_thread import TrainerThread
from swarm.server.view import LiveConfig
from swarm.weights.publish import SNAPSHOT_PREFIX, Publisher, cpu_copy

log = logging.getLogger(__name__)

_SWEEP_S = 0.25


def create_app(settings: ServerSettings, backend: InProcessModel | None = None, *, generator: Generator | None = None,
               trainer: Trainer | None = None) -> FastAPI:
    """Build the app from ``backend`` (both roles) or a ``generator`` + ``trainer`` pair (either may
    be filled from ``backend``). Without ``settings.token`` a loopback server generates one."""
    if trainer is None:
        trainer = backend
    if trainer is None or (generator is None and backend is None):
        raise ValueError("create_app needs a backend, or a generator and a trainer")
    state_dir = settings.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    token = resolve_token(settings.host, settings.token, state_dir)
    client_token = resolve_client_token(settings.client_token, state_dir, token)
    keys = KeyRing(token, load_or_create_secret(state_dir), client_token=client_token,
                   worker_token=resolve_worker_token(settings.worker_token, state_dir, token, client_token))
    store = EpisodeStore(state_dir / "buffer.db")
    checkpoints = CheckpointManager(state_dir / "checkpoints")
    restored = restore(store, checkpoints, trainer, settings.config)
    live = LiveConfig(restored.config or settings.config)  # one cell: the pool, its roster and the core read it
    config = live.config
    # The device thread runs in-process model work: torch generation and/or the torch trainer.
    device_model: Any = backend if backend is not None else trainer
    worker = DeviceWorker(device_model, window_s=config.batch_window_ms / 1000.0, max_rows=config.max_batch_rows)
    if generator is None:
        assert backend is not None  # checked on entry: without a generator there is a backend
        generator = LocalGenerator(backend, worker)
    pool = GeneratorPool(generator, text=generator.text, model_name=generator.model_name,
                         max_context=generator.max_context, eos_token_id=generator.eos_token_id,
                         live=live, local_engine=settings.engine,
                         local_capacity=config.max_batch_rows, include_local=settings.local_generator)
    # A trainer that is not the device thread's model (verl: Ray workers) gets its own thread, so
    # generation on the device thread goes on while it trains.
    trainer_thread = None if trainer is device_model else TrainerThread()
    max_context = min(generator.max_context, settings.max_context or generator.max_context)
    disk = DiskMonitor(state_dir, reserve_bytes=int(settings.disk_reserve_mb * 2**20))
    roles = ModelRoles(generator=pool, trainer=trainer, device=worker, trainer_calls=trainer_thread or worker)
    storage = Storage(state_dir=state_dir, store=store, checkpoints=checkpoints, disk=disk)
    core = ServerCore(live=live, roles=roles, storage=storage, keys=keys, max_context=max_context,
                      defaults=settings.defaults.model_copy(update={"resumed": restored.config is not None}),
                      noise=keyed_noise(settings), seed=settings.seed)
    if settings.deterministic and config.mode != "sync":
        log.warning("--deterministic in async mode: sampling is reproducible, but which version samples an "
                    "episode and which samples a step trains still depend on timing; use mode = \"sync\"")
    core.restore(restored)
    roster = _roster(pool, keys, live, roles)
    # The event log is best effort: on a full disk events still reach subscribers, unrecorded.
    bus = EventBus(start_id=store.last_event_id(), history=store.recent_events(),
                   journal=QuietEventLog(store, disk))
    core.add_listener(bus)
    pool.on_status = core.generator_status  # a vLLM child's health
    parts = _Parts(core=core, worker=worker, trainer_thread=trainer_thread, bus=bus, restored=restored,
                   owns_trainer=trainer is not backend,
                   tracker=ServerRun(settings, config=core.config.model_dump(mode="json"), step=core.step,
                                     store=store, checkpoints=checkpoints)
                   if settings.mlflow_uri else None)
    ctx = AppContext(settings=settings, core=core, lifecycle=core.lifecycle, chat=core.completions,
                     runs=core.runs, keys=keys, max_context=max_context, roster=roster)
    return _http_app(parts, ctx, token)


def _http_app(parts: _Parts, ctx: AppContext, token: str) -> FastAPI:
    """The FastAPI app over the composed parts: its lifespan starts and stops them; routes see ``ctx``."""
    core, bus = parts.core, parts.bus

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = await parts.start(app)
        try:
            yield
        finally:
            await parts.stop(tasks)

    app = FastAPI(title="swarm server", version="1", lifespan=lifespan)
    app.state.ctx = ctx
    app.state.token = token
    app.state.bus = bus
    app.state.request_shutdown = None
    app.state.startup_error = None
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware)
    app.include_router(openai_router, responses=ERROR_RESPONSES)
    app.include_router(episodes_router, responses=ERROR_RESPONSES)
    app.include_router(control_router, responses=ERROR_RESPONSES)
    app.include_router(events_router(bus, require_control, live=core.live), responses=ERROR_RESPONSES)
    app.include_router(workers_router, responses=ERROR_RESPONSES)
    if ctx.roster is not None:
        from swarm.weights.relay import relay_router  # torch (shards): only when the app is built

        authorize = ctx.keys.worker
        app.include_router(relay_router(ctx.roster.publisher.depot, None, authorize), responses=ERROR_RESPONSES)
        app.include_router(relay_router(ctx.roster.publisher.snapshots, None, authorize), prefix=SNAPSHOT_PREFIX,
                           responses=ERROR_RESPONSES)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented hook for a custom schema
    return app


@dataclass
class _Parts:
    """What the app's lifespan starts and stops, in that order and in reverse."""

    core: ServerCore
    worker: DeviceWorker
    trainer_thread: TrainerThread | None
    bus: EventBus
    restored: Restored
    owns_trainer: bool  # a trainer that is not the in-process backend has its own resources to close
    tracker: ServerRun | None = None  # the server's own MLflow run (--mlflow-uri)

    async def start(self, app: FastAPI) -> list[asyncio.Task[None]]:
        core, generator, trainer = self.core, self.core.generator, self.core.trainer
        self.worker.start()
        if self.tracker is not None:
            self.tracker.start()  # never waits on MLflow
            core.add_listener(self.tracker)
        try:
            await generator.start()
        except Exception as exc:  # e.g. vLLM missing or not coming up: `swarm serve` exits with this
            app.state.startup_error = exc
            await asyncio.to_thread(self.worker.stop)
            if self.tracker is not None:
                await asyncio.to_thread(self.tracker.close, f"the server could not start: {exc}")
            raise
        if generator.policy_version != trainer.policy_version:  # restored, or a separate generator model
            await core.publish()
        tasks = [asyncio.create_task(core.run(), name="swarm-trainer"),
                 asyncio.create_task(_sweep(core.lifecycle), name="swarm-sweeper")]
        if core.generator.roster is not None:
            tasks.append(asyncio.create_task(core.generator.roster.run_sweeper(), name="swarm-pool-sweeper"))
        if self.tracker is not None:
            self.tracker.watch(tasks[0])
        for bad in self.restored.quarantined:  # checkpoints that did not load (recovery fell back past them)
            self.bus.publish("checkpoint.quarantined", step=bad.step, path=bad.path, reason=bad.reason)
        self.bus.publish("server.started", step=core.step, policy_version=core.policy_version,
                         restarts=self.restored.restarts, groups_pending=len(self.restored.ready))
        return tasks

    async def stop(self, tasks: list[asyncio.Task[None]]) -> None:
        core = self.core
        core.stopping()
        self.bus.publish("server.stopping", step=core.step, policy_version=core.policy_version)
        self.bus.close()
        for task in reversed(tasks):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("%s died", task.get_name(), exc_info=task.exception())  # the rest still stops
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.tracker is not None:
            await asyncio.to_thread(self.tracker.close)
        await core.generator.close()
        await asyncio.to_thread(self.worker.stop)
        if self.trainer_thread is not None:
            await asyncio.to_thread(self.trainer_thread.stop)
        if self.owns_trainer:
            await asyncio.to_thread(core.trainer.close)
        core.stopped()
        core.store.close()


def _roster(pool: GeneratorPool, keys: KeyRing, live: LiveConfig, roles: ModelRoles) -> Roster | None:
    """The pool's membership and dissemination; None without a worker token. When the trainer streams
    its weights to a local vLLM (NCCL), workers get a state dict exported after each step, and only
    while any is active."""
    if keys.worker_token is None:
        return None
    trainer, calls = roles.trainer, roles.trainer_calls

    async def export() -> tuple[int, Any]:  # one trainer call: the version and its copied weights agree
        return await calls.call(lambda: (trainer.policy_version, cpu_copy(trainer.export_weights())))

    return Roster(pool, Publisher(keys.worker_token, export=export), live)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, plus what it cannot infer: chat completions answer with a ``ChatCompletion``
    (JSON) and responses with a Responses-API object, or either, with ``stream: true``, Server-Sent Events."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        chat = schema.get("paths", {}).get("/v1/chat/completions", {}).get("post")
        if chat is not None:
            model = ChatCompletion.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(model.pop("$defs", {}))
            components.setdefault("ChatCompletion", model)
            chat["responses"]["200"] = {
                "description": "a chat completion; with `stream: true`, SSE chunks ending with `data: [DONE]`",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                            "text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
            }
        responses = schema.get("paths", {}).get("/v1/responses", {}).get("post")
        if responses is not None:
            responses["responses"]["200"] = {
                "description": "a response object; with `stream: true`, SSE events from `response.created` to "
                               "`response.completed`",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
            }
        app.openapi_schema = schema
    return app.openapi_schema


async def _sweep(lifecycle: Lifecycle) -> None:
    """Expire stale leases. A scan of the claimed episodes is cheap, so it runs often enough that
    even sub-second leases (tests, fast agents) expire promptly."""
    while True:
        await asyncio.sleep(_SWEEP_S)
        try:
            expired = lifecycle.expire_stale()
        except Exception:  # the sweeper must survive a bug in one pass
            log.exception("lease sweep failed")
            continue
        if expired:
            log.info("expired %d episode(s) with stale leases", expired)


def keyed_noise(settings: ServerSettings) -> KeyedNoise | None:
    """The server's keyed sampling noise: batch-invariant with ``--deterministic``, shared-batch with
    ``--coupled`` (``swarm.backends.noise.KeyedNoise``); None (a random stream) otherwise."""
    if settings.deterministic:
        return KeyedNoise(settings.seed, batch_invariant=True)
    return KeyedNoise(settings.seed, batch_invariant=False) if settings.coupled else None
