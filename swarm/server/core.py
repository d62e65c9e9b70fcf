"""The core: sole owner of the server's mutable state — episodes, groups, config, counters.

It is composed of one ``Generator`` and one ``Trainer`` (``swarm.backends.base``) and gives each of
its parts what that part uses (live values through ``ServerView``): claims go through ``claims``
(``swarm.server.episodes.claims``; pause, stop and sync drains are refused here, in ``claim``, and work that
could not train within ``max_staleness`` by ``admission``, ``swarm.server.flow.admission``), heartbeats,
finishes, aborts and lease expiry through ``lifecycle`` (``swarm.server.episodes.lifecycle``), chat calls
through ``completions`` (render → generate → record, ``swarm.server.episodes.completions``; a run key's calls
find their episodes through ``runs``, ``swarm.server.episodes.runs``), training through
``loop`` (collect → advantages → update → publish → commit, ``swarm.server.training.step_loop``) and held-out
evaluation through ``evals`` (eval claims, rounds, their ``eval/*`` metrics, ``swarm.server.episodes.evaluation``).
All methods run on the asyncio event loop thread (route handlers and the engine's own tasks), so
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
from pathlib import Path
from typing import Any

from swarm.backends.base import Trainer
from swarm.config import ServerConfig
from swarm.local.device_worker import DeviceWorker
from swarm.pool.pool import GeneratorPool
from swarm.protocol import (
    AbortRequest,
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
from swarm.server.flow.admission import Admission, Backlog
from swarm.server.flow.capacity import CapacityMeter
from swarm.server.records.episode import EpisodeRecord, GroupBook
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.training.step_loop import RunBlocking, StepLoop
from swarm.server.training.step_rows import StepRows

log = logging.getLogger(__name__)

Listener = Callable[[str, dict[str, Any]], object]  # what it returns is ignored


class ServerCore:
    def __init__(self, *, config: ServerConfig, generator: GeneratorPool, trainer: Trainer, worker: DeviceWorker,
                 keys: KeyRing, state_dir: Path, store: EpisodeStore, checkpoints: CheckpointManager,
                 max_context: int, run_blocking: RunBlocking[Any] | None = None,
                 clock: Callable[[], float] = time.time, defaults: ConfigDefaults | None = None,
                 disk: DiskMonitor | None = None, noise_seed: int | None = None) -> None:
        """``noise_seed``: deterministic mode (``swarm serve --deterministic``, the server's seed): keyed
        sampling noise (``completions``), one batch admitted per version (``admission``), each step's
        groups in claim order (``GroupBook``) and the ``random_reward`` coin drawn from the episode's place."""
        self.config = config
        self.defaults = defaults or ConfigDefaults()  # where the starting config's unset keys came from (status)
        self.config_version = 0
        self.generator = generator
        self.trainer = trainer
        self.worker = worker  # the device thread (in-process model work)
        self.keys = keys
        self.state_dir = state_dir
        self.store = store
        self.disk = disk or DiskMonitor(state_dir)  # free space under the state dir (claims, status)
        self.clock = clock
        self._state = ServerState.starting
        self.counts = EpisodeCounts()
        self.capacity = CapacityMeter()  # learner utilisation and per-client rollout rate (``swarm plan``)
        self.episodes = EpisodeRegistry()
        deterministic = noise_seed is not None
        self.groups = GroupBook(canonical=deterministic)
        self._listeners: list[Listener] = []
        self._version = trainer.policy_version
        self._paused = False
        self._started_at = time.monotonic()
        self.created = int(clock())
        self.max_context = max_context
        # The trainer shares the device thread with the local generator: a chat call that arrives
        # while a step trains waits for the update, so it samples (and is tagged with) the new version.
        self._update_blocks_sampling = run_blocking is None
        # The parts get what they use; what changes while serving they read through ``ServerView``.
        # They are built in dependency order, each from parts that exist: what two of them share (the
        # step loop's wake-up, the step-metrics rows) is made first and handed to both.
        wake = asyncio.Event()  # the step loop waits on it; an ended episode, a resume or a config change sets it
        rows = StepRows(store, self)  # the step loop appends its rows; a held-out round merges its eval/* in
        self.evals = Evaluation(self, episodes=self.episodes, publish=rows.add)
        self.lifecycle = Lifecycle(self, episodes=self.episodes, groups=self.groups, store=store, counts=self.counts,
                                   capacity=self.capacity, disk=self.disk, eval_ended=self.evals.ended, wake=wake.set)
        evals = self.evals
        self.loop = StepLoop(self, trainer=trainer, generator=generator, run_blocking=run_blocking or worker.call,
                             checkpoints=checkpoints, store=store, groups=self.groups, episodes=self.episodes,
                             capacity=self.capacity, disk=self.disk, rows=rows, wake=wake, may_step=self._may_step,
                             eval_live=lambda: evals.live, eval_due=evals.due, drop=self.lifecycle.drop,
                             trained=self._trained)
        loop = self.loop
        self.admission = Admission(self, backlog=self._backlog, capacity=self.capacity,
                                   active=lambda: not loop.past_max_steps(), deterministic=deterministic)
        self.claims = Claims(self, keys=keys, episodes=self.episodes, groups=self.groups,
                             category_ratios=config.category_ratios, admission=self.admission,
                             deterministic=deterministic)
        self.completions = Completions(self, generator=generator, max_context=max_context, episodes=self.episodes,
                                       live=self.lifecycle.live, admit_first=self.admission.first_call,
                                       noise_seed=noise_seed)
        self.runs = RunEpisodes(
            self, episodes=self.episodes, open_training=self.open_training,
            abort=lambda episode_id, why: self.lifecycle.abort(episode_id, AbortRequest(reason=why)))
        self._apply_worker_limits()

    def _apply_worker_limits(self) -> None:
        self.worker.set_window(self.config.batch_window_ms / 1000.0, self.config.max_batch_rows,
                               self.config.max_queued_rows)

    # ------------------------------------------------------------------ seams

    def add_listener(self, listener: Listener) -> None:
        """Receive every event the core emits: ``listener(type, data)`` on the event loop."""
        self._listeners.append(listener)

    def emit(self, type_: str, **data: Any) -> None:
        for listener in self._listeners:
            try:
                listener(type_, data)
            except Exception:  # a broken listener must not break the core
                log.exception("event listener failed on %s", type_)

    def restore(self, restored: Restored) -> None:
        """Take over the state ``recovery.restore`` rebuilt (before serving)."""
        self.loop.step = restored.step
        if restored.config is not None:
            self.config = restored.config
            self.claims.reset_throttle(self.config.category_ratios)
            self._apply_worker_limits()
        self.config_version = restored.config_version
        self._version = restored.policy_version
        for name in EpisodeCounts.model_fields:  # in place: the lifecycle counts into the same object
            setattr(self.counts, name, getattr(restored.counts, name))
        self.lifecycle.drop_reasons.update(restored.drop_reasons)
        self.loop.rows.restore()
        for group in restored.ready:
            self.groups.ready.append(group)
            for member in group.members:
                self.episodes.add_finished(member)

    # ------------------------------------------------------------------ properties

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
        return self.loop.rows.rows

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
            raise RetryLater("sync mode: a weight update is pending while in-flight episodes finish",
                             retry_after=0.5)

    # ------------------------------------------------------------------ training

    def batch_ready(self) -> bool:
        """Enough complete groups for a step (``batch_mode``/``batch_groups``)."""
        return self.groups.batch_ready(self.config.batch_mode, self.config.batch_groups, self.config.group_size)

    def _may_step(self) -> bool:
        """The step loop's question: not paused or stopping, a batch is ready and, in sync mode, no
        episode is in flight (the drain)."""
        if self._paused or self._state in (ServerState.stopping, ServerState.stopped):
            return False
        if not self.batch_ready():
            return False
        return self.config.mode == "async" or self.in_flight == 0

    def _backlog(self) -> Backlog:
        """The work held toward future steps, in the batch's unit (``swarm.server.flow.admission``). The
        running step's batch counts where work admitted now could be sampled before its update (a
        trainer on its own thread, pool workers, an update not queued yet); not once sampling can only
        follow the update (one device thread for both: what it samples next carries the new version)."""
        config, loop = self.config, self.loop
        follows = self._update_blocks_sampling and loop.update_queued and not self.generator.remote_members()
        batch = [] if follows else loop.batch
        episodes, groups = self.episodes.live_training()
        if config.batch_mode == "episodes":
            return Backlog(training=sum(len(g.finished) for g in batch), waiting=self.groups.ready_episodes(),
                           in_flight=episodes, batch=config.batch_groups * config.group_size)
        return Backlog(training=len(batch), waiting=len(self.groups.ready), in_flight=groups,
                       batch=config.batch_groups)

    def _trained(self, kept: list[EpisodeRecord], stale: list[EpisodeRecord], reason: str) -> None:
        """A step committed: count its episodes (the stale ones as dropped for ``reason``); they leave
        memory (the store keeps the durable copy)."""
        self.counts.trained += len(kept)
        self.lifecycle.tally_drops(len(stale), reason)
        for episode in (*kept, *stale):
            self.episodes.evict(episode)

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
        """Hand the trainer's weights to the generator now (``StepLoop.publish``); seconds taken."""
        return await self.loop.publish()

    def report(self, where: str, exc: BaseException) -> None:
        """Record an error the server survived: an ``error`` event and the status' ``last_error``."""
        self.loop.report(where, exc)

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
        self.config_version += 1
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
            uptime_s=uptime, generator=self.generator.describe(), last_error=self.loop.last_error,
            workers=self.generator.workers(), drop_reasons=dict(self.lifecycle.drop_reasons),
            refusal_reasons=dict(self.admission.refused), recent=self.capacity.recent(), defaults=self.defaults,
            disk=self.disk.check(), client_sampling=self.completions.client_sampling.counts(),
        )

    def metrics_since(self, since_step: int) -> list[StepMetrics]:
        """The rows of steps after ``since_step`` (``StepRows.since``)."""
        return self.loop.rows.since(since_step)

