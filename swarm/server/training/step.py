"""One training step, read top to bottom: ``train_step`` collects a batch of complete groups, turns their
rewards into advantages, sets aside what is too stale, updates the policy, publishes the new weights
and commits what it trained.

Each line of ``train_step`` calls a named piece: the group book (collect), ``training_rewards`` (the
posted rewards, or the spurious-rewards coin), the trainer (advantages and the update, off the event loop
in order through ``TrainerCalls``), ``select_samples`` (async mode sets aside episodes older than
``max_staleness``), the ``StepLedger`` (the next version id reserved before the update, one durable
commit after it), the ``GeneratorSync`` (the new weights to the generator), ``step_metrics`` and the
episodes' side (``EpisodeOutcomes``: trained ones counted and evicted, dropped ones recorded). When a
step may start is the step loop's business (``swarm.server.training.step_loop``). The step's own
functions below are pure, so what it trains on and reports is easy to test and to read.

Rewards: the trainer's advantages come from the posted rewards or, with ``random_reward``, a coin flip per
episode (the spurious-rewards control, arXiv 2506.10947: random rewards gave Qwen2.5-Math gains and
Llama-family models none, so a study can ask whether its model learns from the reward at all). The flip
is drawn from the episode id, not from a generator's state, so a step retried after a crash or a restart
trains on the same rewards; in deterministic mode from the episode's place in the work (task, round,
member: ``Place.coin_key``) instead, the same in every run.

Metrics (``step_metrics``): ``train/*`` describe the episodes, ``context/*`` what timeline merging did to
the samples and ``episode/<key>`` averages the metrics clients posted with ``finish`` (over the episodes
that sent that key), so a study's own diagnostics sit beside the reward curve. Some claims are judged on
more than the reward: ``train/response_length_mean`` and ``train/response_length_neg_mean`` (generated
tokens per sample, over all samples and over those with a negative advantage: Dr. GRPO's length bias
shows as long wrong answers) are counted here, the same for every trainer; ``train/clip_fraction`` names
the trainer's ``train/pg_clipfrac`` (kept too).

Failures: an update that fails drops its batch (reported, ``where=train_step``), and training goes on.
A full disk parks training, never ends it: a batch whose version cannot be reserved goes back to the
front of the queue (``StepOutcome.WAITS_FOR_DISK``; the loop tries again later), and a commit that cannot
be written waits in order (``swarm.server.training.ledger``). A failed publication is the
``GeneratorSync``'s to report and repair; the step still commits.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from swarm.backends.base import Trainer, TrainSample
from swarm.config import ServerConfig
from swarm.server.durability.diskspace import is_disk_full
from swarm.server.records.episode import EpisodeRecord, Group, GroupBook, stale_reason
from swarm.server.training.error_log import ErrorLog
from swarm.server.training.generator_sync import GeneratorSync
from swarm.server.training.ledger import StepLedger
from swarm.server.training.trainer_thread import TrainerCalls
from swarm.server.view import ServerView

log = logging.getLogger(__name__)

__all__ = ["EpisodeOutcomes", "RunningStep", "Selected", "StepOutcome", "StepParts", "coin", "response_lengths",
           "select_samples", "step_metrics", "train_step", "training_rewards"]


class EpisodeOutcomes(Protocol):
    """What becomes of a step's episodes (``swarm.server.episodes.lifecycle.Lifecycle``)."""

    def drop(self, episodes: list[EpisodeRecord], reason: str) -> None:
        """Set episodes aside untrained, for ``reason`` (those no longer held are skipped)."""

    def trained(self, kept: list[EpisodeRecord], stale: list[EpisodeRecord], reason: str) -> None:
        """A step committed: ``kept`` trained, ``stale`` were dropped for ``reason``; both leave memory."""


class StepOutcome(enum.Enum):
    TRAINED = "trained"  # the policy changed and the step committed
    SKIPPED = "skipped"  # nothing in the batch could train: it was dropped
    FAILED = "failed"  # the update failed: the batch was dropped and the error reported
    WAITS_FOR_DISK = "waits_for_disk"  # no room to reserve a version: the batch went back to the queue
    DEFERRED = "deferred"  # a held-out round goes first: no batch was taken (``StepLoop.train_step``)


@dataclass
class RunningStep:
    """The step in progress as admission sees it (``StepLoop.backlog``): the groups it trains and
    whether its update is queued; and whether a wait for disk space was reported already."""

    batch: list[Group] = field(default_factory=list)
    update_queued: bool = False
    waits_for_disk: bool = False


@dataclass(frozen=True)
class StepParts:
    """What a step touches, built once by the core."""

    view: ServerView  # the live config, the policy version, events
    trainer: Trainer
    calls: TrainerCalls  # where the trainer's blocking calls run
    groups: GroupBook  # the complete groups waiting for a step
    episodes: EpisodeOutcomes
    sync: GeneratorSync
    ledger: StepLedger
    errors: ErrorLog


@dataclass
class Selected:
    """A batch's samples, and its episodes split into those that train and those too stale to."""

    samples: list[TrainSample]
    kept: list[EpisodeRecord]
    stale: list[EpisodeRecord]


async def train_step(parts: StepParts, running: RunningStep) -> StepOutcome:
    """One step over the next batch (the loop checked one is ready); how it ended."""
    view, trainer, ledger = parts.view, parts.trainer, parts.ledger
    config = view.config  # one config for the whole step: a change meanwhile applies to the next one
    started = time.perf_counter()
    # collect: the oldest complete groups
    groups = running.batch = parts.groups.take_batch(config.batch_mode, config.batch_groups, config.group_size)
    episodes = [member for group in groups for member in group.finished]
    view.emit("step.started", step=ledger.step + 1, groups=len(groups), episodes=len(episodes))
    try:
        # advantages: from the posted rewards (or the coin), per group
        rewards = training_rewards(episodes, config.random_reward)
        keys = [e.group_key for e in episodes]
        advantages = await parts.calls.call(lambda: trainer.advantages(rewards, keys, config))
        # samples: what is still fresh enough to train
        batch = select_samples(episodes, advantages, config, oldest=view.policy_version - config.max_staleness,
                               version=trainer.policy_version)
        if not batch.samples:
            log.warning("step skipped: every episode of the batch was too stale or had no tokens")
            parts.episodes.drop(batch.stale, stale_reason(config.max_staleness))
            parts.episodes.drop(batch.kept, "no trainable tokens")
            return StepOutcome.SKIPPED
        # update: the version it makes is reserved first, so a restart never reuses its id
        ledger.reserve_version(view.policy_version + 1)
        running.update_queued = True  # no await between this and the queueing of the update
        update = await parts.calls.call(lambda: trainer.train_step(batch.samples, config))
    except Exception as exc:
        return _failed(parts, running, episodes, exc)
    # publish: the generator serves the new version
    update["perf/weight_sync_s"] = await parts.sync.publish()
    update["perf/generator_lag"] = parts.sync.lag()
    if config.random_reward > 0:  # what the advantages came from; train/reward_mean stays the posted rewards
        update["train/trained_reward_mean"] = sum(rewards) / len(rewards)
    parts.sync.after_step(update)  # the pool's figures; a drifting worker is drained
    # commit: the step's metrics, what trained and what dropped, in one durable write
    metrics = step_metrics(batch.kept, len(groups), batch.samples, update, merge=config.merge_timelines)
    metrics["train/groups_dropped_uniform"] = float(parts.groups.take_dropped_uniform())  # since the last step
    metrics.update(ledger.counters(len(batch.kept), len(batch.samples), started))
    reason = stale_reason(config.max_staleness)
    row = ledger.commit(batch.kept, batch.stale, reason, metrics)
    running.waits_for_disk = False
    parts.episodes.trained(batch.kept, batch.stale, reason)  # counted; they leave memory
    view.emit("step.finished", step=row.step, metrics=row.metrics)
    view.emit("weights.updated", policy_version=view.policy_version, step=row.step)
    return StepOutcome.TRAINED


def select_samples(episodes: list[EpisodeRecord], advantages: list[float], config: ServerConfig, *, oldest: int,
                   version: int) -> Selected:
    """The batch's samples at the trainer's ``version``; in async mode episodes sampled before version
    ``oldest`` (``max_staleness`` behind the policy) are set aside."""
    selected = Selected(samples=[], kept=[], stale=[])
    for episode, advantage in zip(episodes, advantages, strict=True):
        sampled_at = episode.trace.min_version
        if config.mode == "async" and sampled_at is not None and sampled_at < oldest:
            selected.stale.append(episode)
            continue
        selected.kept.append(episode)
        selected.samples.extend(episode.samples(float(advantage), version))
    return selected


def coin(episode_id: str, p: float) -> float:
    """1.0 with probability ``p``, else 0.0, the same for an episode id every time."""
    draw = int.from_bytes(hashlib.sha256(f"random_reward:{episode_id}".encode()).digest()[:8], "big") / 2**64
    return 1.0 if draw < p else 0.0


def training_rewards(episodes: Sequence[EpisodeRecord], random_reward: float) -> list[float]:
    """The rewards the trainer turns into advantages: each episode's posted one, or (``random_reward`` > 0)
    its coin flip."""
    if random_reward > 0:
        return [coin(e.place.coin_key or e.episode_id, random_reward) for e in episodes]
    return [float(e.reward or 0.0) for e in episodes]


def step_metrics(episodes: Sequence[EpisodeRecord], groups: int, samples: Sequence[TrainSample],
                 update: dict[str, float], *, merge: bool) -> dict[str, float]:
    """Slash-keyed metrics of one step; the backend's own ``update`` metrics are included as-is."""
    rewards = [float(e.reward or 0.0) for e in episodes]
    n = len(rewards)
    mean = sum(rewards) / n if n else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else 0.0
    metrics: dict[str, float] = {
        "train/reward_mean": mean,
        "train/reward_std": std,
        "train/reward_max": max(rewards) if rewards else 0.0,
        "train/episodes": float(n),
        "train/groups": float(groups),
        "context/samples_per_episode": len(samples) / n if n else 0.0,
        "context/tokens_trained": float(sum(len(s.tokens) for s in samples)),
        "context/generated_tokens": float(sum(sum(s.loss_mask) for s in samples)),
        "context/drift_forks": float(sum(e.trace.drift_forks for e in episodes)),
        "context/drift_repaired": float(sum(e.trace.drift_repaired for e in episodes)),
        "rollout/tool_calls": float(sum(e.trace.tool_calls for e in episodes)),
        "rollout/tool_parse_errors": float(sum(e.trace.tool_parse_errors for e in episodes)),
        "rollout/tool_calls_extra": float(sum(e.trace.tool_calls_extra for e in episodes)),
        "context/merge": 1.0 if merge else 0.0,
    }
    posted: dict[str, list[float]] = {}
    for episode in episodes:
        for key, value in (episode.finish.metrics if episode.finish is not None else {}).items():
            posted.setdefault(key, []).append(value)
    for key, values in posted.items():
        metrics[f"episode/{key}"] = sum(values) / len(values)
    metrics.update(response_lengths(samples))
    for key, value in update.items():
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            metrics[key] = float(value)
    if "train/pg_clipfrac" in metrics:  # the name the catalog and the docs use, for every trainer
        metrics["train/clip_fraction"] = metrics["train/pg_clipfrac"]
    return metrics


def response_lengths(samples: Sequence[TrainSample]) -> dict[str, float]:
    """Mean generated tokens (``loss_mask`` ones) per sample, and over the negative-advantage samples
    alone (absent when the batch has none: a 0 would read as "short")."""
    lengths = [(sum(s.loss_mask), s.advantage) for s in samples]
    metrics = {"train/response_length_mean": sum(n for n, _ in lengths) / len(lengths) if lengths else 0.0}
    negative = [n for n, advantage in lengths if advantage < 0]
    if negative:
        metrics["train/response_length_neg_mean"] = sum(negative) / len(negative)
    return metrics


def _failed(parts: StepParts, running: RunningStep, episodes: list[EpisodeRecord], exc: Exception) -> StepOutcome:
    """A step that raised before its update finished: a full disk before the version was reserved puts
    the batch back (nothing trained); anything else drops it. Either way it is reported."""
    if is_disk_full(exc) and not running.update_queued:
        parts.groups.put_back(running.batch)
        parts.ledger.disk.failed("reserving a policy version", exc)
        if not running.waits_for_disk:  # a retry is not news
            parts.errors.report("train_step", exc)
        running.waits_for_disk = True
        return StepOutcome.WAITS_FOR_DISK
    log.exception("training step failed; its batch is dropped")
    parts.episodes.drop(episodes, f"training step failed: {exc}")
    parts.errors.report("train_step", exc)
    return StepOutcome.FAILED
