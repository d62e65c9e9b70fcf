"""Restart recovery: rebuild a core's training state from its state dir after a crash or a stop.

Why: ``swarm serve`` on an existing state dir must resume where the last run left off, lose no
episode whose ``finish`` returned and train none twice. The protocol (store + checkpoints, see
``swarm.server.durability.store``): load the newest complete checkpoint (weights, optimizer, step, live config),
forget every training step after it (``rollback_after``: those updates died with the process, so
their episodes are untrained again), then re-file the untrained finished episodes as trainable
groups. Members that were still claimed at the crash are gone; a group is judged on what finished.

A latest checkpoint that does not load (a truncated ``model.safetensors``, an unreadable
``meta.json``) is quarantined (``CheckpointManager.quarantine``: renamed to ``.bad-step-<N>``) and the
one before it is tried, down to the oldest; the app publishes a ``checkpoint.quarantined`` event for
each. If checkpoints exist but none loads, the server refuses to start (``RecoveryError``, so
``swarm serve`` exits with code 2) instead of training on from the base weights: a failed load may
have left part of its state in the trainer, and a silent fresh start would throw away every step
trained so far. The refusal names what was quarantined; started again, the server finds no
checkpoint and begins from the base weights (its buffered episodes train again), as an explicit
choice of the operator.

Policy versions never go backwards: the highest version ever served is kept in the store's meta
table. When the restored weights are older than that (steps after the checkpoint were lost), the
restored state gets a NEW version id above the highest one, so a client never sees a version it
saw before paired with different weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from swarm.backends.base import Trainer
from swarm.config import ServerConfig
from swarm.protocol import EpisodeCounts, EpisodeState, FinishRequest
from swarm.server.durability.checkpoints import Checkpoint, CheckpointManager
from swarm.server.durability.store import EpisodeStore
from swarm.server.records.episode import Claim, EpisodeRecord, Group, is_stale
from swarm.server.records.finished import FinishedEpisode

log = logging.getLogger(__name__)

MAX_VERSION_KEY = "max_policy_version"
CONFIG_KEY = "live_config"
RESTARTS_KEY = "restarts"


class RecoveryError(ValueError):
    """Checkpoints exist but none loads: the server must not start (see the module docstring)."""


@dataclass(frozen=True)
class Quarantined:
    """A checkpoint that did not load and was renamed aside."""

    step: int
    path: str  # where it is now (``.bad-step-<N>``)
    reason: str


@dataclass
class Restored:
    """What a restarted core takes over."""

    step: int = 0
    config: ServerConfig | None = None
    config_version: int = 0
    policy_version: int = 0
    ready: list[Group] = field(default_factory=list)  # trainable groups, in finish order
    counts: EpisodeCounts = field(default_factory=EpisodeCounts)
    drop_reasons: dict[str, int] = field(default_factory=dict)
    rolled_back: int = 0
    restarts: int = 0
    quarantined: list[Quarantined] = field(default_factory=list)  # newest first


def restore(store: EpisodeStore, checkpoints: CheckpointManager, trainer: Trainer, config: ServerConfig) -> Restored:
    """Load the newest checkpoint that loads into ``trainer`` and rebuild the pending groups. Call once, before
    the server serves (the device thread is not running yet, so ``trainer.load`` runs here; the
    core publishes the restored weights to its generator when it starts)."""
    latest, quarantined = _load_newest(checkpoints, trainer)
    out = Restored(restarts=int(store.get_meta(RESTARTS_KEY, 0)) + 1, quarantined=quarantined)
    store.put_meta(RESTARTS_KEY, out.restarts)
    if latest is not None:
        out.step = latest.step
        log.info("restored checkpoint step %d (policy version %d) from %s", latest.step, latest.policy_version,
                 latest.path)
    out.config, out.config_version = _live_config(store, latest.config if latest else {},
                                                  (latest.server_state if latest else {}), config)
    # Never reuse a version id: older weights than the newest served get a fresh, higher id.
    highest = int(store.get_meta(MAX_VERSION_KEY, 0))
    if trainer.policy_version < highest:
        trainer.policy_version = highest + 1
    out.policy_version = trainer.policy_version
    store.put_meta(MAX_VERSION_KEY, out.policy_version)
    out.rolled_back = store.rollback_after(out.step)
    live = out.config or config
    dropped: list[str] = []
    for key, members in store.pending_groups().items():
        group = _group(f"r{out.restarts}:{key}", members, live)
        if group.trainable(min_group_size=live.min_group_size, varied_only=live.batch_mode == "varied_groups"):
            out.ready.append(group)
        else:
            dropped.extend(m.episode_id for m in group.members)
    if dropped:
        store.mark_dropped(dropped, "group incomplete after restart")
    counts = store.counts()
    out.drop_reasons = store.drop_reasons()
    out.counts = EpisodeCounts(
        claimed=counts["finished"] + counts["aborted"] + counts["expired"], finished=counts["finished"],
        aborted=counts["aborted"], expired=counts["expired"], trained=counts["trained"], dropped=counts["dropped"],
        dropped_stale=sum(n for reason, n in out.drop_reasons.items() if is_stale(reason)))
    if latest is not None or out.ready or out.rolled_back:
        log.info("resumed at step %d: %d pending group(s), %d episode(s) rolled back, %d dropped",
                 out.step, len(out.ready), out.rolled_back, len(dropped))
    return out


def _load_newest(checkpoints: CheckpointManager, trainer: Trainer) -> tuple[Checkpoint | None, list[Quarantined]]:
    """Load the newest checkpoint that loads into ``trainer``, quarantining every newer one that does
    not. ``RecoveryError`` if there were checkpoints and none loaded."""
    quarantined: list[Quarantined] = []
    for path in checkpoints.newest_first():
        step = int(path.name.removeprefix("step-"))
        try:
            checkpoint = checkpoints.load_meta(path)
            if checkpoint.step != step:
                raise ValueError(f"meta.json says step {checkpoint.step}")
            trainer.load(str(checkpoint.weights_dir))
        # Broad on purpose: how a damaged file fails is the loader's business (safetensors, torch's
        # unpickler, json, a Ray worker); quarantine is only a rename, undone by hand if it was wrong.
        except Exception as exc:
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, for the event and the refusal
            log.error("checkpoint %s does not load (%s)", path, reason)
            quarantined.append(Quarantined(step=step, path=str(checkpoints.quarantine(path)), reason=reason))
            continue
        return checkpoint, quarantined
    if quarantined:
        names = ", ".join(f"{q.path} ({q.reason})" for q in quarantined)
        raise RecoveryError(
            f"no checkpoint in {checkpoints.root} loads; quarantined {names}. Start again to train from the "
            "base weights (buffered episodes train again), or move a good checkpoint back as step-<N>")
    return None, quarantined


def _live_config(store: EpisodeStore, checkpoint_config: dict[str, Any], server_state: dict[str, Any],
                 default: ServerConfig) -> tuple[ServerConfig | None, int]:
    """The newest live config: the store's copy (written on every PATCH) or else the checkpoint's."""
    saved = store.get_meta(CONFIG_KEY)
    candidates: list[tuple[int, dict[str, Any]]] = []
    if isinstance(saved, dict) and isinstance(saved.get("values"), dict):
        candidates.append((int(saved.get("version", 0)), saved["values"]))
    if checkpoint_config:
        candidates.append((int(server_state.get("config_version", 0)), checkpoint_config))
    for version, values in sorted(candidates, key=lambda c: -c[0]):
        try:
            return default.patched(values), version
        except ValueError as exc:  # a config this build no longer accepts: keep the given one
            log.warning("ignoring saved live config v%d: %s", version, exc)
    return None, 0


def _group(key: str, members: list[FinishedEpisode], config: ServerConfig) -> Group:
    first = members[0]
    group = Group(key=key, group_id=first.group_id, size=first.group_size, category=first.category)
    for m in members:
        claim = Claim(version=min((v for t in m.trace.timelines for v in t.versions), default=0), step=0,
                      lease_s=config.lease_s, expires_at=m.finished_at)
        record = EpisodeRecord(
            episode_id=m.episode_id, task_id=m.task_id, group_key=key, group_id=m.group_id, category=m.category,
            client_id=m.client_id, trace=m.trace, claim=claim,
        )
        record.state = EpisodeState.finished
        record.finish = FinishRequest(reward=m.outcome.reward, metrics=m.outcome.metrics, metadata=m.outcome.metadata)
        group.members.append(record)
    return group
