"""The training loop: when a step may start, and what runs between steps (checkpoints, warm-ups).

``StepLoop.run`` waits until a batch of complete groups is ready and a step is allowed, then runs one
step (``swarm.server.training.step``: collect → advantages → update → publish → commit, read top to
bottom in ``train_step``), and repeats. A step is allowed when the server is neither paused nor stopping,
the batch is ready (``batch_mode``/``batch_groups``), in sync mode no episode is in flight (the drain),
``max_steps`` is not reached, the disk has room for the commits before it, and no held-out round is
live or due.

Held-out evaluation: a step does not start while eval episodes are live (their round evaluates the
policy they were claimed under), nor, for ``eval_hold_s`` at most, after a step the clients evaluate
at whose round was not claimed yet (aligned rounds, see ``swarm.server.episodes.evaluation``); an eval
claim that arrives while a step trains waits for it (``between_steps``). A round that ends adds its
``eval/*`` metrics to the row of the step it evaluated (``StepRows.add``).

A full disk (``swarm.server.durability.diskspace``) parks training, never ends it: the loop tries again
every ``RETRY_AFTER_S`` and goes on by itself once space is back. Checkpoints (``checkpoint_every``,
``checkpoint``) and supervised warm-ups (``sft``) never interleave with an update; a failed periodic
checkpoint (a full disk, ``ulimit -f``) is reported and the next steps train and commit. Errors
training survives are reported through the ``ErrorLog`` (``where``: ``train_step``, ``publish``,
``commit``, ``checkpoint``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from swarm.pool.pool import GeneratorPool
from swarm.protocol import SftRequest, SftResult
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.diskspace import RETRY_AFTER_S
from swarm.server.durability.recovery import MAX_VERSION_KEY
from swarm.server.durability.retention import enforce_retention
from swarm.server.durability.store import store_safely
from swarm.server.errors import BadRequest
from swarm.server.flow.admission import Backlog
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.training.sft import run_sft
from swarm.server.training.step import RunningStep, StepOutcome, StepParts, train_step

log = logging.getLogger(__name__)

__all__ = ["HeldOutRounds", "StepLoop"]


class HeldOutRounds(Protocol):
    """The held-out rounds a step waits for (``swarm.server.episodes.evaluation.Evaluation``)."""

    @property
    def live(self) -> int:
        """Eval episodes still claimed."""

    def due(self, step: int) -> bool:
        """A round of ``step`` is due at the clients' cadence and not claimed yet."""


class StepLoop:
    """Runs a training step whenever one is allowed (module docstring); checkpoints; warm-ups.

    It is given what a step touches (``parts``), the held-out rounds it waits for (``evals``), the
    episode registry (the sync drain, the backlog), the generator pool (its remote members, warm-ups),
    the checkpoints, and the ``wake`` event it waits on, which whatever may let a step start sets
    (an episode ended, a resume, a config change). ``sampling_waits_for_update``: the trainer shares
    the device thread with the generator, so what it samples after an update is queued carries the new
    version (``backlog``)."""

    def __init__(self, parts: StepParts, *, evals: HeldOutRounds, episodes: EpisodeRegistry,
                 generator: GeneratorPool, checkpoints: CheckpointManager, wake: asyncio.Event,
                 sampling_waits_for_update: bool) -> None:
        self.parts = parts
        self.view = parts.view
        self.ledger = parts.ledger
        self._evals = evals
        self._episodes = episodes
        self._generator = generator
        self._checkpoints = checkpoints
        self.wake = wake
        self._sampling_waits_for_update = sampling_waits_for_update
        self.running = RunningStep()  # the step in progress (admission counts its batch)
        self.training = False
        self.idle = asyncio.Event()  # set while no step trains (eval claims wait on it)
        self.idle.set()
        self._update_lock = asyncio.Lock()  # a checkpoint or warm-up never interleaves with an update
        self._parked_until = 0.0  # a full disk: no step starts before this (monotonic) time
        self._hold_timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self.eval_waiting = 0  # eval claims waiting for a running step to end

    @property
    def step(self) -> int:
        """The last committed step."""
        return self.ledger.step

    async def run(self) -> None:
        """Wait for a ready batch, step, repeat. Runs as a task for the app's life (until ``stop``)."""
        self.wake.set()  # groups restored from the buffer may already make a batch
        while not self._stopping:
            await self.wake.wait()
            self.wake.clear()
            while self.can_step():
                if not self.ledger.commits.flush():  # an earlier step's bookkeeping waits for space first
                    self._park()
                    break
                outcome = await self.train_step()
                if outcome is StepOutcome.WAITS_FOR_DISK:
                    self._park()
                every = self.view.config.checkpoint_every
                if outcome is StepOutcome.TRAINED and every and self.step % every == 0:
                    await self._periodic_checkpoint()

    def stop(self) -> None:
        """No new step starts; ``run`` returns once the running one (if any) ends."""
        self._stopping = True
        self.wake.set()

    def can_step(self) -> bool:
        """A step may start now (module docstring)."""
        if self._stopping or self._eval_pending() or self.past_max_steps() or time.monotonic() < self._parked_until:
            return False
        return self._batch_allowed() and not self._held_for_eval()

    def _batch_allowed(self) -> bool:
        """Not paused, a batch is ready and, in sync mode, no episode is in flight (the drain)."""
        config = self.view.config
        if self.view.paused or not self.parts.groups.batch_ready(config.batch_mode, config.batch_groups,
                                                                 config.group_size):
            return False
        return config.mode == "async" or self._episodes.in_flight == 0

    def _park(self) -> None:
        """The disk is full: no step for ``RETRY_AFTER_S``, then the loop wakes and tries again."""
        self._parked_until = time.monotonic() + RETRY_AFTER_S
        asyncio.get_running_loop().call_later(RETRY_AFTER_S, self.wake.set)

    def past_max_steps(self) -> bool:
        return bool(self.view.config.max_steps) and self.step >= self.view.config.max_steps

    def backlog(self) -> Backlog:
        """The work held toward future steps, in the batch's unit (``swarm.server.flow.admission``). The
        running step's batch counts where work admitted now could be sampled before its update (a
        trainer on its own thread, pool workers, an update not queued yet); not once sampling can only
        follow the update (one device thread for both: what it samples next carries the new version)."""
        config, running, groups = self.view.config, self.running, self.parts.groups
        follows = self._sampling_waits_for_update and running.update_queued and not self._generator.remote_members()
        batch = [] if follows else running.batch
        episodes, live_groups = self._episodes.live_training()
        if config.batch_mode == "episodes":
            return Backlog(training=sum(len(g.finished) for g in batch), waiting=groups.ready_episodes(),
                           in_flight=episodes, batch=config.batch_groups * config.group_size)
        return Backlog(training=len(batch), waiting=len(groups.ready), in_flight=live_groups,
                       batch=config.batch_groups)

    def _eval_pending(self) -> bool:
        return bool(self._evals.live or self.eval_waiting)

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
        if not self._evals.due(self.step):
            return False
        left = self.view.config.eval_hold_s - (time.monotonic() - self.ledger.last_step_at)
        if left <= 0:
            if self._hold_timer is not None:
                log.warning("no held-out round of step %d within eval_hold_s; training goes on", self.step)
                self._hold_timer = None
            return False
        loop = asyncio.get_running_loop()
        if self._hold_timer is None or self._hold_timer.when() < loop.time():
            self._hold_timer = loop.call_later(left + 0.01, self.wake.set)
        return True

    async def train_step(self) -> StepOutcome:
        """One step (``swarm.server.training.step.train_step``), unless an eval round goes first."""
        async with self._update_lock:
            if self._eval_pending():  # an eval round goes first
                return StepOutcome.DEFERRED
            self.training = True
            self.idle.clear()
            try:
                return await train_step(self.parts, self.running)
            finally:
                self.running.batch, self.running.update_queued = [], False
                self.training = False
                self.idle.set()
                self.wake.set()  # sync-mode claims may resume; another batch may be ready

    async def checkpoint(self) -> Path:
        """Write ``checkpoints/step-<N>/`` (the trainer's weights + optimizer in ``weights/``, a
        loadable model folder; step, policy version, live config and buffer cursor in ``meta.json``).
        Never interleaves with an update, so the weights always match the step they are named by."""
        view, store, trainer = self.view, self.ledger.store, self.parts.trainer
        async with self._update_lock:
            self.ledger.commits.require_written()  # a full disk: ENOSPC before anything is written
            step, version = self.step, view.policy_version
            server_state = {"cursor": store.cursor(), "config_version": view.config_version,
                            "max_policy_version": version}
            config = view.config.model_dump(mode="json")
            path = await self.parts.calls.call(lambda: self._checkpoints.save(
                step, version, lambda d: trainer.save(str(d)), server_state, config=config))
        view.emit("checkpoint.saved", step=step, policy_version=version, path=str(path))
        # Bounded storage: episodes no kept checkpoint can train again go (swarm.server.durability.retention).
        pruned = await asyncio.to_thread(enforce_retention, store, self._checkpoints, view.config, store.path.parent)
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
            self.parts.errors.report("checkpoint", exc)

    async def sft(self, request: SftRequest, max_context: int) -> SftResult:
        """Supervised warm-up: ``request.steps`` mini-batches of the examples, then one publication.
        Examples that cannot be trained are a 400 (nothing is updated then)."""
        view, store = self.view, self.ledger.store
        async with self._update_lock:
            store_safely("reserve policy versions", lambda: store.put_meta(
                MAX_VERSION_KEY, view.policy_version + request.steps))
            try:
                losses = await run_sft(self._generator, self.parts.trainer, self.parts.calls, view.config, request,
                                       max_context)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            await self.parts.sync.publish()
        store_safely("record policy version", lambda: store.put_meta(MAX_VERSION_KEY, view.policy_version))
        view.emit("weights.updated", policy_version=view.policy_version, step=self.step, sft_steps=request.steps)
        return SftResult(steps=request.steps, loss_first=losses[0], loss_last=losses[-1],
                         policy_version=view.policy_version)
