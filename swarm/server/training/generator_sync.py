"""``GeneratorSync``: keeps the generator on the trainer's weights, and says how far behind it is.

Publication: after every update (and after a supervised warm-up or a restore) the trainer's weights go
to the generator as its new version (``Generator.load_weights``, or ``load_streamed`` when the trainer
streams its own weights); that call is what moves the version completions are tagged with. Any failure
of it, or one that takes longer than ``publish_timeout_s``, is reported (``where=publish``) and the
generator is restarted on the new weights before training goes on (``generator.recover``; a generator
without it, the in-process torch one, loads them again). If that fails too, it is reported as well and
the next step publishes again. Each step records ``perf/generator_lag``: policy versions the generator
is behind the trainer after the publication (0 when it serves the new weights). The generator is never
left silently behind.
"""

from __future__ import annotations

import asyncio
import logging
import time

from swarm.backends.base import Trainer
from swarm.pool.pool import GeneratorPool
from swarm.server.training.error_log import ErrorLog
from swarm.server.training.trainer_thread import TrainerCalls
from swarm.server.view import ServerView

log = logging.getLogger(__name__)

__all__ = ["GeneratorSync"]


class GeneratorSync:
    """Publishes the trainer's weights to the generator (the pool) and reports what went wrong."""

    def __init__(self, view: ServerView, *, trainer: Trainer, generator: GeneratorPool, calls: TrainerCalls,
                 errors: ErrorLog) -> None:
        self._view = view
        self.trainer = trainer
        self.generator = generator
        self._calls = calls
        self._errors = errors

    async def publish(self) -> float:
        """Hand the trainer's current weights to the generator as its new version; seconds taken.
        The generator serves new requests with them; completions carry the version that made them.
        A failure or a timeout is reported and the generator restarted on them (module docstring)."""
        started = time.perf_counter()
        version = self.trainer.policy_version
        config = self._view.config
        self.generator.mode = config.mode  # vLLM pauses around updates in sync mode
        try:
            await asyncio.wait_for(self._send(version), config.publish_timeout_s)
        except Exception as exc:  # whatever broke, the generator must not stay behind
            await self._recover(version, _publish_failure(version, exc, config.publish_timeout_s))
        seconds = time.perf_counter() - started
        self._view.emit("weights.published", policy_version=version, step=self._view.step, sync_s=seconds,
                        generator_version=self.generator.policy_version)
        return seconds

    def lag(self) -> float:
        """Policy versions the generator is behind the trainer (``perf/generator_lag``)."""
        return float(self.trainer.policy_version - self.generator.policy_version)

    def after_step(self, metrics: dict[str, float]) -> None:
        """Add the pool's figures to a step's metrics; drain a worker whose log-probs drifted past
        ``max_worker_logprob_diff`` (``GeneratorPool.after_step``)."""
        self.generator.after_step(metrics, self._view.config.max_worker_logprob_diff)

    async def _send(self, version: int) -> None:
        generator = self.generator
        if generator.streams_weights:  # the trainer streams them (NCCL): no state dict here
            await generator.load_streamed(version)
            return
        weights = await self._calls.call(self.trainer.export_weights)
        await generator.load_weights(version, weights)

    async def _recover(self, version: int, failure: Exception) -> None:
        """Report a failed publication and restart the generator on ``version``'s weights."""
        log.error("%s", failure, exc_info=failure.__cause__)
        self._errors.report("publish", failure)
        generator = self.generator
        budget = self._view.config.publish_timeout_s + generator.start_timeout
        try:
            weights = await asyncio.wait_for(self._calls.call(self.trainer.export_weights), budget)
            await asyncio.wait_for(generator.recover(version, weights), budget)
        except Exception as exc:  # reported; the next step publishes again
            log.exception("restarting the generator on policy version %d failed", version)
            self._errors.report("publish", RuntimeError(
                f"restarting the generator on policy version {version} failed: {type(exc).__name__}: {exc}; it "
                f"serves version {generator.policy_version}; the next step publishes again"))
            return
        self._view.emit("generator.recovered", policy_version=version, step=self._view.step,
                        generator_version=generator.policy_version, restarted=generator.restarts_on_recover)


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
