"""The training loop, read like the algorithm: collect ready groups → advantages → update → publish
weights → commit.

``StepLoop`` owns what a step needs: the ``Trainer`` (which updates the policy, off the event loop
through ``run_blocking``), the ``Generator`` (which receives each new version explicitly), the step
counter and the step metrics. Episode state stays with the ``ServerCore``; the loop takes complete groups
from it and hands back what it trained or dropped.

Durability: before an update the next version id is reserved in the store (with the default
shared torch backend a completion can be tagged with it before the step commits, and a restart must
never hand the same id to different weights); after it, ``store.commit_step`` writes the trained
and dropped episodes, the version and the step's metrics in one transaction. A crash between the
update and the commit therefore loses the whole step (its episodes train again after a restart) and
never half of it. Checkpoints (``checkpoint_every``) never interleave with an update.

A full disk (``swarm.server.durability.diskspace``) parks training, never ends it: a batch whose version cannot
be reserved goes back to the front of the queue, a commit that cannot be written waits in order
(``swarm.server.training.step_commits``), and no step or checkpoint starts until it is written; the loop
tries again every ``RETRY_AFTER_S`` and goes on by itself once space is back.

Errors training survives (a failed update, publication or periodic checkpoint) are logged with
their traceback and reported by ``report``: an ``error`` event with ``where``, and ``last_error`` in
``GET /api/v1/status``. A failed periodic checkpoint (a full disk, ``ulimit -f``) never ends the
loop: the next steps train and commit, and the next checkpoint tries again.

Publication: any failure of ``generator.load_weights`` (or ``load_streamed``, when the trainer
streams its own weights), or one that takes longer than ``publish_timeout_s``, is reported
(``where=publish``) and the generator is restarted on the new weights before training goes on
(``generator.recover``; a generator without it, the in-process torch one, loads them again). If
that fails too, it is reported as well and the next step publishes again. Each step records
``perf/generator_lag``: policy versions the generator is behind the trainer after the publication
(0 when it serves the new weights). The generator is never left silently behind.

Held-out evaluation: a step does not start while eval episodes are live (their round evaluates the
policy they were claimed under), nor, for ``eval_hold_s`` at most, after a step the clients evaluate
at whose round was not claimed yet (aligned rounds, see ``swarm.server.episodes.evaluation``); a round that
ends adds its ``eval/*`` metrics to the row of the step it evaluated (``StepRows.add``, called by
``swarm.server.episodes.evaluation``). No step starts past ``max_steps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from swarm.backends.base import Trainer, TrainSample
from swarm.config import ServerConfig
from swarm.pool.pool import GeneratorPool
from swarm.protocol import LastError, SftRequest, SftResult, StepMetrics
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.diskspace import RETRY_AFTER_S, DiskMonitor, is_disk_full
from swarm.server.durability.recovery import MAX_VERSION_KEY
from swarm.server.durability.retention import enforce_retention
from swarm.server.durability.store import EpisodeStore, store_safely
from swarm.server.errors import BadRequest
from swarm.server.flow.capacity import CapacityMeter
from swarm.server.records.episode import EpisodeRecord, Group, GroupBook, stale_reason
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.training.rewards import training_rewards
from swarm.server.training.sft import run_sft
from swarm.server.training.step_commits import StepCommit, StepCommits
from swarm.server.training.step_rows import StepRows
from swarm.server.training.stepstats import step_metrics
from swarm.server.view import ServerView

log = logging.getLogger(__name__)

T = TypeVar("T")

# Cumulative per-step metrics (see StepLoop._totals).
TOTAL_EPISODES = "train/episodes_total"
TOTAL_SAMPLES = "train/samples_total"

RunBlocking = Callable[[Callable[[], T]], Awaitable[T]]


Drop = Callable[[list[EpisodeRecord], str], None]
Trained = Callable[[list[EpisodeRecord], list[EpisodeRecord], str], None]


class StepLoop:
    """Runs training steps whenever the core has a ready batch; checkpoints; supervised warm-ups.

    The core gives it what a step touches: the trainer, generator, store, checkpoints, the group
    book (``take_batch``), the episode registry (evictions), the capacity meter, the step-metrics
    rows it appends to (shared with held-out evaluation), the ``wake`` event it waits on, and three
    callbacks: ``may_step`` (a batch is ready and the engine's state allows a step), ``drop``
    (episodes set aside with a reason) and ``trained`` (the kept and stale episodes of a committed
    step and the stale ones' drop reason, for the engine's counts). ``batch`` is what the running
    step trains and ``update_queued`` says its update is queued (admission counts the batch until the
    step commits, or until then where sampling waits out the update). ``eval_live`` counts the live held-out
    episodes a step waits for; ``eval_due(step)`` says a held-out round of ``step`` is due and not
    claimed yet (aligned rounds). ``disk`` says when a failed write was for want of space."""

    def __init__(self, view: ServerView, *, trainer: Trainer, generator: GeneratorPool, run_blocking: RunBlocking[Any],
                 checkpoints: CheckpointManager, store: EpisodeStore, groups: GroupBook, episodes: EpisodeRegistry,
                 capacity: CapacityMeter, disk: DiskMonitor, rows: StepRows, wake: asyncio.Event,
                 may_step: Callable[[], bool], eval_live: Callable[[], int], eval_due: Callable[[int], bool],
                 drop: Drop, trained: Trained) -> None:
        self.view = view
        self.store = store
        self.groups = groups
        self.episodes = episodes
        self.capacity = capacity
        self.disk = disk
        self.commits = StepCommits(store, disk, on_full=lambda step, exc: self.report("commit", exc))
        self._parked_until = 0.0  # a full disk: no step starts before this (monotonic) time
        self._disk_waits = False  # a batch waits for space to reserve its version (reported once)
        self._may_step = may_step
        self._eval_live = eval_live
        self._eval_due = eval_due
        self._drop = drop
        self._trained = trained
        self.trainer = trainer
        self.generator = generator
        self.run_blocking = run_blocking
        self.checkpoints = checkpoints
        self.step = 0
        self.rows = rows  # the step metrics: the newest in memory, all in the buffer
        self.training = False
        self.batch: list[Group] = []  # the groups the running step trains
        self.update_queued = False  # its update is queued to run (a chat call after it samples the new weights)
        self.last_error: LastError | None = None
        self.wake = wake  # set by whatever may let a step start (an episode ended, a resume, a config change)
        self.idle = asyncio.Event()  # set while no step trains (eval claims wait on it)
        self.idle.set()
        self._update_lock = asyncio.Lock()  # a checkpoint or warm-up never interleaves with an update
        self._last_step_at = time.monotonic()
        self._hold_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self.eval_waiting = 0  # eval claims waiting for a running step to end

    async def run(self) -> None:
        """Wait for a ready batch, step, repeat. Runs as a task for the app's life (until ``stop``)."""
        self.wake.set()  # groups restored from the buffer may already make a batch
        while not self._stopping:
            await self.wake.wait()
            self.wake.clear()
            while self.can_step():
                if not self.commits.flush():  # an earlier step's bookkeeping waits for space first
                    self._park()
                    break
                stepped = await self.train_step()
                every = self.view.config.checkpoint_every
                if stepped and every and self.step % every == 0:
                    await self._periodic_checkpoint()

    def stop(self) -> None:
        """No new step starts; ``run`` returns once the running one (if any) ends."""
        self._stopping = True
        self.wake.set()

    def can_step(self) -> bool:
        """A step may start now: not stopping, below ``max_steps``, no eval round live or arriving (a
        round evaluates one policy), the core says a batch is ready and its state allows one
        (``may_step``), and no round is due at the clients' cadence (aligned rounds)."""
        if self._stopping or self._eval_pending() or self.past_max_steps() or time.monotonic() < self._parked_until:
            return False
        return self._may_step() and not self._held_for_eval()

    def _park(self) -> None:
        """The disk is full: no step for ``RETRY_AFTER_S``, then the loop wakes and tries again."""
        self._parked_until = time.monotonic() + RETRY_AFTER_S
        asyncio.get_running_loop().call_later(RETRY_AFTER_S, self.wake.set)

    def past_max_steps(self) -> bool:
        return bool(self.view.config.max_steps) and self.step >= self.view.config.max_steps

    def _eval_pending(self) -> bool:
        return bool(self._eval_live() or self.eval_waiting)

    async def between_steps(self) -> None:
        """Hold an eval claim that arrives while a step trains until the step ends; no new step
        starts while one waits, so eval claims are never starved by back-to-back steps."""
        self.eval_waiting += 1
        try:
            while self.training:
                await self.idle.wait()
        finally:
            self.eval_waiting -= 1
            self.wake.set()

    def _held_for_eval(self) -> bool:
        """The round of the current step is due and the hold has not run out (a timer wakes the loop
        when it does, in case nothing else happens meanwhile)."""
        if not self._eval_due(self.step):
            return False
        left = self.view.config.eval_hold_s - (time.monotonic() - self._last_step_at)
        if left <= 0:
            if self._hold_timer is not None:
                log.warning("no held-out round of step %d within eval_hold_s; training goes on", self.step)
                self._hold_timer = None
            return False
        loop = asyncio.get_running_loop()
        if self._hold_timer is None or self._hold_timer.when() < loop.time():
            self._hold_timer = loop.call_later(left + 0.01, self.wake.set)
        return True

    async def train_step(self) -> bool:
        """One step. ``True`` if the policy changed."""
        async with self._update_lock:
            if self._eval_pending():  # an eval round goes first
                return False
            started = time.perf_counter()
            config = self.view.config
            self.training = True
            self.idle.clear()
            try:
                groups = self.groups.take_batch(config.batch_mode, config.batch_groups, config.group_size)  # collect
                self.batch = groups
                return await self._step(groups, config, started)
            finally:
                self.batch, self.update_queued = [], False
                self.training = False
                self.idle.set()
                self.wake.set()  # sync-mode claims may resume; another batch may be ready

    async def _step(self, groups: list[Group], config: ServerConfig, started: float) -> bool:
        view = self.view
        episodes = [m for g in groups for m in g.finished]
        view.emit("step.started", step=self.step + 1, groups=len(groups), episodes=len(episodes))
        try:
            rewards = training_rewards(episodes, config.random_reward)  # posted, or the spurious-rewards coin
            keys = [e.group_key for e in episodes]
            advantages = await self.run_blocking(lambda: self.trainer.advantages(rewards, keys, config))  # advantages
            samples, kept, stale = self._samples(episodes, advantages, config)
            if not samples:
                log.warning("step skipped: every episode of the batch was too stale or had no tokens")
                self._drop(stale, stale_reason(config.max_staleness))
                self._drop(kept, "no trainable tokens")
                return False
            self.store.put_meta(MAX_VERSION_KEY, view.policy_version + 1)  # reserve the next version id
            self.update_queued = True  # no await between this and the queueing of the update
            update = await self.run_blocking(lambda: self.trainer.train_step(samples, config))  # update
        except Exception as exc:
            if is_disk_full(exc) and not self.update_queued:  # the version was not reserved: nothing trained
                self.groups.ready[:0] = groups  # the batch waits at the front of the queue for space
                self.disk.failed("reserving a policy version", exc)
                if not self._disk_waits:  # a retry is not news
                    self.report("train_step", exc)
                self._disk_waits = True
                self._park()
                return False
            log.exception("training step failed; its batch is dropped")
            self._drop([e for e in episodes if self.episodes.held(e.episode_id)], f"training step failed: {exc}")
            self.report("train_step", exc)
            return False
        update["perf/weight_sync_s"] = await self.publish()                                     # publish
        update["perf/generator_lag"] = float(self.trainer.policy_version - self.generator.policy_version)
        if config.random_reward > 0:  # what the advantages came from; train/reward_mean stays the posted rewards
            update["train/trained_reward_mean"] = sum(rewards) / len(rewards)
        self.generator.after_step(update, self.view.config.max_worker_logprob_diff)  # pool metrics, mismatch drain
        self._commit(len(groups), kept, stale, samples, update, started, config)                # commit
        return True

    def _samples(self, episodes: list[EpisodeRecord], advantages: list[float], config: ServerConfig
                 ) -> tuple[list[TrainSample], list[EpisodeRecord], list[EpisodeRecord]]:
        """Samples of the batch; in async mode episodes older than ``max_staleness`` are set aside."""
        oldest = self.view.policy_version - config.max_staleness
        samples: list[TrainSample] = []
        kept: list[EpisodeRecord] = []
        stale: list[EpisodeRecord] = []
        for episode, advantage in zip(episodes, advantages, strict=True):
            version = episode.trace.min_version
            if config.mode == "async" and version is not None and version < oldest:
                stale.append(episode)
                continue
            kept.append(episode)
            samples.extend(episode.samples(float(advantage), self.trainer.policy_version))
        return samples, kept, stale

    async def publish(self) -> float:
        """Hand the trainer's current weights to the generator as its new version; seconds taken.
        The generator serves new requests with them; completions carry the version that made them.
        A failure or a timeout is reported and the generator restarted on them (module docstring)."""
        started = time.perf_counter()
        version = self.trainer.policy_version
        self.generator.mode = self.view.config.mode  # vLLM pauses around updates in sync mode
        timeout = self.view.config.publish_timeout_s
        try:
            await asyncio.wait_for(self._send(version), timeout)
        except Exception as exc:  # whatever broke, the generator must not stay behind
            await self._recover(version, _publish_failure(version, exc, timeout))
        seconds = time.perf_counter() - started
        self.view.emit("weights.published", policy_version=version, step=self.step, sync_s=seconds,
                         generator_version=self.generator.policy_version)
        return seconds

    async def _send(self, version: int) -> None:
        generator = self.generator
        if generator.streams_weights:  # the trainer streams them (NCCL): no state dict here
            await generator.load_streamed(version)
            return
        weights = await self.run_blocking(self.trainer.export_weights)
        await generator.load_weights(version, weights)

    async def _recover(self, version: int, failure: Exception) -> None:
        """Report a failed publication and restart the generator on ``version``'s weights."""
        log.error("%s", failure, exc_info=failure.__cause__)
        self.report("publish", failure)
        generator = self.generator
        budget = self.view.config.publish_timeout_s + generator.start_timeout
        try:
            weights = await asyncio.wait_for(self.run_blocking(self.trainer.export_weights), budget)
            await asyncio.wait_for(generator.recover(version, weights), budget)
        except Exception as exc:  # reported; the next step publishes again
            log.exception("restarting the generator on policy version %d failed", version)
            self.report("publish", RuntimeError(f"restarting the generator on policy version {version} failed: "
                                                f"{type(exc).__name__}: {exc}; it serves version "
                                                f"{generator.policy_version}; the next step publishes again"))
            return
        self.view.emit("generator.recovered", policy_version=version, step=self.step,
                         generator_version=generator.policy_version, restarted=generator.restarts_on_recover)

    def _commit(self, groups: int, kept: list[EpisodeRecord], stale: list[EpisodeRecord], samples: list[TrainSample],
                update: dict[str, float], started: float, config: ServerConfig) -> None:
        view = self.view
        step = self.step + 1
        now = time.monotonic()
        metrics = step_metrics(kept, groups, samples, update, merge=config.merge_timelines)
        metrics["train/groups_dropped_uniform"] = float(self.groups.take_dropped_uniform())  # since the last step
        metrics.update(self._totals(step, len(kept), len(samples)))
        metrics["perf/step_s"] = time.perf_counter() - started
        metrics["perf/episodes_per_s"] = len(kept) / max(now - self._last_step_at, 1e-9)
        metrics.update(self.capacity.step_finished(metrics["perf/step_s"]))
        record = StepMetrics(step=step, policy_version=view.policy_version, time=view.clock(), metrics=metrics)
        reason = stale_reason(config.max_staleness)
        dropped = {reason: [e.episode_id for e in stale]} if stale else {}
        # The update happened: a commit a full disk refuses waits (step_commits), before the next step.
        self.commits.commit(StepCommit(step, [e.episode_id for e in kept], record.model_dump_json(), dropped=dropped,
                                       meta={MAX_VERSION_KEY: view.policy_version}))
        self.step, self._disk_waits = step, False
        self._last_step_at = now
        self._trained(kept, stale, reason)  # counted; they leave memory (the store keeps the durable copy)
        self.rows.append(record)
        view.emit("step.finished", step=step, metrics=metrics)
        view.emit("weights.updated", policy_version=view.policy_version, step=step)

    def _totals(self, step: int, episodes: int, samples: int) -> dict[str, float]:
        """Cumulative counts through ``step``: the x-axis for judging learning per episode consumed
        (MLflow plots against step or time only). They continue the last committed row before
        ``step``, so a restart that retrains steps after its checkpoint counts them once."""
        before = next((m.metrics for m in reversed(self.rows.rows) if m.step < step and TOTAL_EPISODES in m.metrics),
                      {})
        return {TOTAL_EPISODES: before.get(TOTAL_EPISODES, 0.0) + episodes,
                TOTAL_SAMPLES: before.get(TOTAL_SAMPLES, 0.0) + samples}

    async def checkpoint(self) -> Path:
        """Write ``checkpoints/step-<N>/`` (the trainer's weights + optimizer in ``weights/``, a
        loadable model folder; step, policy version, live config and buffer cursor in ``meta.json``).
        Never interleaves with an update, so the weights always match the step they are named by."""
        view = self.view
        async with self._update_lock:
            self.commits.require_written()  # a full disk: ENOSPC before anything is written
            step, version = self.step, view.policy_version
            engine_state = {"cursor": self.store.cursor(), "config_version": view.config_version,
                            "max_policy_version": version}
            config = view.config.model_dump(mode="json")
            path = await self.run_blocking(lambda: self.checkpoints.save(
                step, version, lambda d: self.trainer.save(str(d)), engine_state, config=config))
        view.emit("checkpoint.saved", step=step, policy_version=version, path=str(path))
        # Bounded storage: episodes no kept checkpoint can train again go (swarm.server.durability.retention).
        pruned = await asyncio.to_thread(enforce_retention, self.store, self.checkpoints, view.config,
                                         self.store.path.parent)
        if pruned is not None:
            view.emit("retention.pruned", through_step=pruned.through, episodes=pruned.episodes,
                      timelines=pruned.timelines, exported=str(pruned.exported) if pruned.exported else None)
        return path

    async def _periodic_checkpoint(self) -> None:
        """A ``checkpoint_every`` checkpoint; a failure is reported and training goes on (the step is
        committed in the buffer already; a restart resumes from the previous checkpoint and
        retrains what came after it)."""
        try:
            await self.checkpoint()
        except Exception as exc:
            log.exception("checkpoint of step %d failed; training continues", self.step)
            self.report("checkpoint", exc)

    def report(self, where: str, exc: BaseException) -> None:
        """Record an error training survived: an ``error`` event and the status' ``last_error``."""
        message = str(exc) or type(exc).__name__
        self.last_error = LastError(where=where, message=message, at=self.view.clock())
        self.view.emit("error", where=where, message=message, step=self.step)

    async def sft(self, request: SftRequest, max_context: int) -> SftResult:
        """Supervised warm-up: ``request.steps`` mini-batches of the examples, then one publication.
        Examples that cannot be trained are a 400 (nothing is updated then)."""
        view = self.view
        async with self._update_lock:
            store_safely("reserve policy versions", lambda: self.store.put_meta(
                MAX_VERSION_KEY, view.policy_version + request.steps))
            try:
                losses = await run_sft(self.generator, self.trainer, self.run_blocking, view.config, request,
                                       max_context)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            await self.publish()
        store_safely("record policy version", lambda: self.store.put_meta(
            MAX_VERSION_KEY, view.policy_version))
        view.emit("weights.updated", policy_version=view.policy_version, step=self.step, sft_steps=request.steps)
        return SftResult(steps=request.steps, loss_first=losses[0], loss_last=losses[-1],
                         policy_version=view.policy_version)


def _publish_failure(version: int, exc: Exception, timeout: float) -> Exception:
    """The error to report for a failed publication of ``version`` (``exc`` kept as its cause)."""
    if isinstance(exc, TimeoutError):
        failure: Exception = TimeoutError(f"publishing policy version {version} took longer than "
                                          f"publish_timeout_s={timeout:g} s; restarting the generator on it")
    else:
        failure = RuntimeError(f"publishing policy version {version} failed ({type(exc).__name__}: {exc}); "
                               "restarting the generator on it")
    failure.__cause__ = exc
    return failure
