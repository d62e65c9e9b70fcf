"""The core: sole owner of the server's mutable state — episodes, groups, config, counters.

It is composed of one ``Generator`` and one ``Trainer`` (``swarm.backends.base``, with the threads they
run on: ``ModelRoles``) and the state dir's durable parts (``Storage``), and gives each of its parts the
objects that part calls (live values through ``ServerView``): claims go through ``claims``
(``swarm.server.episodes.claims``; pause, stop and sync drains are refused here, in ``claim``, and work that
could not train within ``max_staleness`` by ``admission``, ``swarm.server.flow.admission``), heartbeats,
finishes, aborts and lease expiry through ``lifecycle`` (``swarm.server.episodes.lifecycle``), chat calls
through ``completions`` (render → generate → record, ``swarm.server.episodes.completions``; a run key's calls
find their episodes through ``runs``, ``swarm.server.episodes.runs``), training through
``loop`` (when a step runs, ``swarm.server.training.step_loop``; the step itself, collect → advantages →
update → publish → commit, is ``swarm.server.training.step.train_step``) and held-out
evaluation through ``evals`` (eval claims, rounds, their ``eval/*`` metrics, ``swarm.server.episodes.evaluation``).
All methods run on the asyncio event loop thread (route handlers and the core's own tasks), so
state changes need no locks; blocking model work runs on the device thread and is awaited.
Episode lifecycle: CLAIMED → FINISHED | ABORTED | EXPIRED (``protocol.EPISODE_TRANSITIONS``).

Durability (``swarm.server.durability.store``/``checkpoints``/``recovery``): a finished episode is committed to
the SQLite buffer before ``finish`` returns; each training step commits what it trained and dropped
in one transaction right after the update, before any checkpoint of that step; aborted, expired and
dropped episodes are recorded too. ``restore`` (called once before serving) resumes from the latest
checkpoint. Every state change calls ``self.emit(type, **data)`` (listeners: ``add_listener``).
A full disk under the state dir (``disk``, ``swarm.server.durability.diskspace``) refuses claims with 507 and
shows in the status' ``disk``; the writes that meet it roll back and are retried (``lifecycle``, ``loop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from swarm.backends.base import Trainer
from swarm.backends.noise import KeyedNoise
from swarm.config import ServerConfig
from swarm.local.device_worker import DeviceWorker
from swarm.pool.pool import GeneratorPool
from swarm.protocol import (
    ClaimRequest,
    ConfigDefaults,
    ConfigView,
    Episode,
    EpisodeCounts,
    ServerState,
    SftRequest,
    SftResult,
    Status,
    StepMetrics,
)
from swarm.server.auth import KeyRing
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.diskspace import RETRY_AFTER_S, DiskMonitor
from swarm.server.durability.recovery import CONFIG_KEY, Restored
from swarm.server.durability.store import EpisodeStore, store_safely
from swarm.server.episodes.claims import Claims
from swarm.server.episodes.completions import Completions
from swarm.server.episodes.evaluation import Evaluation
from swarm.server.episodes.lifecycle import Lifecycle
from swarm.server.episodes.runs import RunEpisodes
from swarm.server.errors import BadRequest, InsufficientStorage, RetryLater
from swarm.server.flow.admission import Admission
from swarm.server.flow.capacity import CapacityMeter
from swarm.server.records.episode import EpisodeRecord, GroupBook
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.training.error_log import ErrorLog
from swarm.server.training.generator_sync import GeneratorSync
from swarm.server.training.ledger import StepLedger
from swarm.server.training.step import StepParts
from swarm.server.training.step_loop import StepLoop
from swarm.server.training.step_rows import StepRows
from swarm.server.training.trainer_thread import TrainerCalls
from swarm.server.view import LiveConfig

log = logging.getLogger(__name__)

__all__ = ["Listener", "ModelRoles", "ServerCore", "Storage"]


class Listener(Protocol):
    """Receives every event the core emits (the event bus, the server's MLflow run)."""

    def on_event(self, type_: str, data: dict[str, Any]) -> object:
        """``type_`` (``episode.*``, ``step.*``, …) and its data, on the event loop; what it returns is ignored."""


@dataclass(frozen=True)
class ModelRoles:
    """The model side of the server: the generator (a pool over the local one and any workers), the
    trainer, the device thread that runs in-process model work, and where the trainer's blocking calls
    run (``trainer_calls``: the device thread itself, or a ``TrainerThread`` of their own)."""

    generator: GeneratorPool
    trainer: Trainer
    device: DeviceWorker
    trainer_calls: TrainerCalls


@dataclass(frozen=True)
class Storage:
    """The state dir's durable parts: the episode buffer, the checkpoints and the free-space monitor."""

    state_dir: Path
    store: EpisodeStore
    checkpoints: CheckpointManager
    disk: DiskMonitor


class ServerCore:
    def __init__(self, *, live: LiveConfig, roles: ModelRoles, storage: Storage, keys: KeyRing, max_context: int,
                 clock: Callable[[], float] = time.time, defaults: ConfigDefaults | None = None,
                 noise: KeyedNoise | None = None, seed: int = 0) -> None:
        """``live``: the config it starts with (the pool reads the same cell). ``seed``: the server's, which
        salts the held-out episodes' sampling seeds (``completions.eval_seed``). ``noise``: deterministic or
        coupled mode (``swarm serve --deterministic``/``--coupled``, the server's seed): keyed sampling
        noise (``completions``), each step's groups in claim order (``GroupBook``) and the
        ``random_reward`` coin drawn from the episode's place; deterministic mode also admits one batch
        per version (``admission``), coupled mode keeps the config's admission."""
        self.live = live
        self.defaults = defaults or ConfigDefaults()  # where the starting config's unset keys came from (status)
        generator, trainer = roles.generator, roles.trainer
        self.generator = generator
        self.trainer = trainer
        self.worker = roles.device  # the device thread (in-process model work)
        self.keys = keys
        self.state_dir = storage.state_dir
        self.store = store = storage.store
        self.disk = storage.disk  # free space under the state dir (claims, status)
        self.clock = clock
        self._state = ServerState.starting
        self.counts = EpisodeCounts()
        self.capacity = CapacityMeter()  # learner utilisation and per-client rollout rate (``swarm plan``)
        self.episodes = EpisodeRegistry()
        deterministic = noise is not None
        self.groups = GroupBook(canonical=deterministic)
        self._listeners: list[Listener] = []
        self._version = trainer.policy_version
        self._paused = False
        self._started_at = time.monotonic()
        self.created = int(clock())
        self.max_context = max_context
        # The parts get the objects they call; what changes while serving they read through ``ServerView``.
        # They are built in dependency order, each from parts that exist: what two of them share (the
        # step loop's wake-up, the step-metrics rows, the error log) is made first and handed to both.
        wake = asyncio.Event()  # the step loop waits on it; an ended episode, a resume or a config change sets it
        self.rows = rows = StepRows(store, self)  # each step appends its row; a held-out round merges its eval/* in
        self.errors = errors = ErrorLog(self)  # what training survived: error events, the status' last_error
        self.evals = Evaluation(self, episodes=self.episodes, rows=rows)
        self.lifecycle = Lifecycle(self, episodes=self.episodes, groups=self.groups, store=store, counts=self.counts,
                                   capacity=self.capacity, disk=self.disk, evals=self.evals, wake=wake)
        calls = roles.trainer_calls
        self.sync = GeneratorSync(self, trainer=trainer, generator=generator, calls=calls, errors=errors)
        ledger = StepLedger(self, store=store, disk=self.disk, rows=rows, capacity=self.capacity, errors=errors)
        parts = StepParts(view=self, trainer=trainer, calls=calls, groups=self.groups, episodes=self.lifecycle,
                          sync=self.sync, ledger=ledger, errors=errors)
        # A trainer on the device thread shares it with the local generator: a chat call that arrives
        # while a step trains waits for the update, so it samples (and is tagged with) the new version.
        self.loop = StepLoop(parts, evals=self.evals, episodes=self.episodes, generator=generator,
                             checkpoints=storage.checkpoints, wake=wake, sampling_waits_for_update=calls is roles.device)
        self.admission = Admission(self, training=self.loop, capacity=self.capacity,
                                   deterministic=noise is not None and noise.batch_invariant)
        self.claims = Claims(self, keys=keys, episodes=self.episodes, groups=self.groups,
                             category_ratios=self.config.category_ratios, admission=self.admission,
                             deterministic=deterministic)
        self.completions = Completions(self, generator=generator, max_context=max_context, episodes=self.episodes,
                                       lifecycle=self.lifecycle, admission=self.admission, noise=noise, seed=seed)
        self.runs = RunEpisodes(self, episodes=self.episodes, claims=self, lifecycle=self.lifecycle)
        self._apply_worker_limits()

    def _apply_worker_limits(self) -> None:
        self.worker.set_window(self.config.batch_window_ms / 1000.0, self.config.max_batch_rows,
                               self.config.max_queued_rows)

    # ------------------------------------------------------------------ seams

    def add_listener(self, listener: Listener) -> None:
        """Receive every event the core emits: ``listener.on_event(type, data)`` on the event loop."""
        self._listeners.append(listener)

    def emit(self, type_: str, **data: Any) -> None:
        for listener in self._listeners:
            try:
                listener.on_event(type_, data)
            except Exception:  # a broken listener must not break the core
                log.exception("event listener failed on %s", type_)

    def generator_status(self, _: object) -> None:
        """The generator's own health changed (a vLLM child): a ``generator.status`` event."""
        self.emit("generator.status", **self.generator.describe())

    def restore(self, restored: Restored) -> None:
        """Take over the state ``recovery.restore`` rebuilt (before serving)."""
        self.loop.ledger.step = restored.step
        if restored.config is not None:
            self.config = restored.config
            self.claims.reset_throttle(self.config.category_ratios)
            self._apply_worker_limits()
        self.live.version = restored.config_version
        self._version = restored.policy_version
        for name in EpisodeCounts.model_fields:  # in place: the lifecycle counts into the same object
            setattr(self.counts, name, getattr(restored.counts, name))
        self.lifecycle.drop_reasons.update(restored.drop_reasons)
        self.rows.restore()
        for group in restored.ready:
            self.groups.ready.append(group)
            for member in group.members:
                self.episodes.add_finished(member)

    # ------------------------------------------------------------------ properties

    @property
    def config(self) -> ServerConfig:
        """The live config (``LiveConfig``: replaced by every ``PATCH /api/v1/config``)."""
        return self.live.config

    @config.setter
    def config(self, config: ServerConfig) -> None:
        self.live.config = config

    @property
    def config_version(self) -> int:
        return self.live.version

    @property
    def state(self) -> ServerState:
        """``training`` while a step trains (unless stopping), else the state the core was put in."""
        if self.loop.training and self._state in (ServerState.running, ServerState.paused):
            return ServerState.training
        return self._state

    @property
    def policy_version(self) -> int:
        """The trainer's newest version (the generator serves it once published); never goes back."""
        self._version = max(self._version, self.trainer.policy_version)
        return self._version

    @property
    def step(self) -> int:
        return self.loop.step

    @property
    def metrics(self) -> list[StepMetrics]:
        return self.rows.rows

    @property
    def in_flight(self) -> int:
        return self.episodes.in_flight

    @property
    def paused(self) -> bool:
        """Paused by ``POST /api/v1/control/pause``: no claims and no new steps until resumed."""
        return self._paused

    # ------------------------------------------------------------------ episodes

    async def claim(self, request: ClaimRequest, base_url: str) -> Episode:
        """Admit a claim (``swarm.server.episodes.claims``) and answer with its episode; a retried claim (same
        ``request_id``) gets the episode the first one created. An eval claim that arrives while a
        step trains waits for it to end (``swarm.server.episodes.evaluation``)."""
        if request.purpose == "eval":
            await self.loop.between_steps()
        retried = self.episodes.by_request(request.request_id)
        if retried is not None:
            return self.claims.view(retried, base_url)
        if request.purpose == "eval":
            if self.loop.training:
                raise RetryLater("a training step is running; claim the eval episode after it", retry_after=0.2)
            self._admit(evaluating=True)
            episode = self.evals.claim(request)
        else:
            episode = self.open_training(request)
        return self.claims.view(episode, base_url)

    def open_training(self, request: ClaimRequest) -> EpisodeRecord:
        """A training episode, admitted as any claim is (a claim, or a run key's new conversation)."""
        self._admit()
        episode = self.claims.open(request)
        self.counts.claimed += 1
        self.emit("episode.claimed", episode_id=episode.episode_id, task_id=request.task_id,
                  group_id=episode.group_id, category=request.category, client_id=request.client_id)
        return episode

    def _admit(self, *, evaluating: bool = False) -> None:
        """Refuse new claims (429) while paused, or in sync mode while a batch waits for a drain
        (``evaluating``: an eval claim, which that drain waits for instead); 507 while the disk is full."""
        if self.state in (ServerState.stopping, ServerState.stopped):
            raise RetryLater("the server is stopping", retry_after=5.0)
        if self._paused:
            raise RetryLater("the server is paused; claims resume after POST /api/v1/control/resume",
                             retry_after=2.0)
        disk = self.disk.check()
        if disk.full:  # what room is left goes to the episodes already running
            raise InsufficientStorage(f"the disk under the server's state dir is full ({disk.reason}); no new "
                                      "episode is claimed until space is freed: retry after Retry-After",
                                      detail=disk.model_dump(), retry_after=RETRY_AFTER_S)
        if evaluating:
            return
        if self.config.mode == "sync" and (self.loop.training or self.batch_ready()):
            # Named, as admission's is: a client refused here starts a due held-out round from it (``_runner``).
            raise RetryLater("sync mode: a weight update is pending while in-flight episodes finish",
                             retry_after=0.5, detail={"reason": "sync_drain", "step": self.step})

    # ------------------------------------------------------------------ training

    def batch_ready(self) -> bool:
        """Enough complete groups for a step (``batch_mode``/``batch_groups``)."""
        return self.groups.batch_ready(self.config.batch_mode, self.config.batch_groups, self.config.group_size)

    async def run(self) -> None:
        """The training loop (``StepLoop.run``); runs as a task for the app's life."""
        self._state = ServerState.running
        await self.loop.run()

    async def sft(self, request: SftRequest) -> SftResult:
        """A supervised warm-up (``StepLoop.sft``) within the served context length."""
        return await self.loop.sft(request, self.max_context)

    async def checkpoint(self) -> Path:
        """A checkpoint now (``StepLoop.checkpoint``)."""
        return await self.loop.checkpoint()

    async def publish(self) -> float:
        """Hand the trainer's weights to the generator now (``GeneratorSync.publish``); seconds taken."""
        return await self.sync.publish()

    def report(self, where: str, exc: BaseException) -> None:
        """Record an error the server survived: an ``error`` event and the status' ``last_error``."""
        self.errors.report(where, exc)

    # ------------------------------------------------------------------ control

    def patch_config(self, values: Mapping[str, object]) -> ConfigView:
        try:
            config = self.config.patched(values)
            self.trainer.check_config(config)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if config.category_ratios != self.config.category_ratios:
            self.claims.reset_throttle(config.category_ratios)
        self.config = config
        self.live.version += 1
        # Durable at once, so a crash before the next checkpoint does not undo a live change.
        store_safely("save live config", lambda: self.store.put_meta(
            CONFIG_KEY, {"version": self.config_version, "values": config.model_dump(mode="json")}))
        self._apply_worker_limits()
        self.emit("config.changed", version=self.config_version, values=values)
        self.loop.wake.set()
        return self.config_view()

    def config_view(self) -> ConfigView:
        return ConfigView(version=self.config_version, values=self.config.model_dump(mode="json"))

    def pause(self) -> None:
        self._paused = True
        if self._state is ServerState.running:
            self._state = ServerState.paused

    def resume(self) -> None:
        self._paused = False
        if self._state is ServerState.paused:
            self._state = ServerState.running
        self.loop.wake.set()

    def stopping(self) -> None:
        self._state = ServerState.stopping
        self.loop.stop()

    def stopped(self) -> None:
        """Everything is closed (the app's lifespan ended)."""
        self._state = ServerState.stopped

    def status(self) -> Status:
        uptime = time.monotonic() - self._started_at
        stats = self.worker.stats  # the device thread's generation counters
        counts = self.counts.model_copy(update={"refused_stale": sum(self.admission.refused.values())})
        return Status(
            state=self.state, model=self.generator.model_name, policy_version=self.policy_version,
            step=self.step, episodes=counts, groups_pending=len(self.groups.ready),
            groups_dropped_uniform=self.groups.dropped_uniform,
            clients=len({e.client_id for e in self.episodes.live()}), config_version=self.config_version,
            throughput={
                "in_flight": float(self.in_flight),
                "episodes_per_s": self.counts.finished / max(uptime, 1e-9),
                "generated_tokens": float(stats.tokens),
                "tokens_per_s": stats.tokens / stats.generate_s if stats.generate_s else 0.0,
                "rows_per_batch": stats.rows / stats.batches if stats.batches else 0.0,
                "chat_rows_in_flight": float(self.completions.in_flight.rows),
                "cancelled_rows": float(stats.cancelled),
            },
            uptime_s=uptime, generator=self.generator.describe(), last_error=self.errors.last,
            workers=self.generator.workers(), drop_reasons=dict(self.lifecycle.drop_reasons),
            refusal_reasons=dict(self.admission.refused), recent=self.capacity.recent(), defaults=self.defaults,
            disk=self.disk.check(), client_sampling=self.completions.client_sampling.counts(),
        )

    def metrics_since(self, since_step: int) -> list[StepMetrics]:
        """The rows of steps after ``since_step`` (``StepRows.since``)."""
        return self.rows.since(since_step)

