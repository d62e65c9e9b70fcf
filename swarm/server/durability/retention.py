"""Bounded storage: after each checkpoint, drop the episodes no restart can train again.

Why: a server left running for days records every episode's token timeline in its buffer
(``swarm.server.durability.store``); kept forever, the state dir grows with every episode until the disk fills.
A restart resumes from one of the kept checkpoints (``swarm.server.durability.checkpoints`` keeps the newest
``keep``) and rolls back only the steps after it (``EpisodeStore.rollback_after``), so an episode trained
at or before the **oldest kept checkpoint's step** stays trained whichever kept checkpoint loads: its
trace and rows are audit material only. With ``retention = "since_checkpoint"`` (the default) those
episodes are pruned right after a checkpoint is written: their timelines, ``episodes`` rows and
``training_log`` rows go, and a ~40-byte record each stays in the buffer's pruned ledger
(``swarm.server.durability.store_pruned``), so counts and the exactly-once audit still hold and a retried finish
is still the usual no-op. Untrained, dropped and later-trained episodes are never touched.
``retention_export_dir`` writes the episodes about to go to a Parquet file first
(``swarm.server.durability.export``); if that fails nothing is dropped. ``retention = "all"`` keeps everything.

Space: SQLite does not shrink a file when rows go; it reuses the freed pages, so the buffer reaches a
steady size (the episodes of about ``keep x checkpoint_every`` steps) plus the ledger's ~40 bytes an
episode, instead of growing by a trace and a row with every episode. Retention never raises: a failure
is logged and retried at the next checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from swarm.config import ServerConfig
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.export import export_episodes
from swarm.server.durability.store import PRUNED_KEY, EpisodeStore

log = logging.getLogger(__name__)

__all__ = ["Pruned", "enforce_retention", "safe_step"]


@dataclass(frozen=True)
class Pruned:
    """What one retention pass pruned: the episodes trained at steps ``(after, through]``."""

    after: int
    through: int
    episodes: int
    timelines: int
    exported: Path | None = None


def safe_step(checkpoints: CheckpointManager) -> int:
    """The oldest kept checkpoint's step (0 without one): episodes trained at or before it stay
    trained after any restart from a kept checkpoint."""
    kept = checkpoints.all()[-checkpoints.keep:]
    return kept[0].step if kept else 0


def enforce_retention(store: EpisodeStore, checkpoints: CheckpointManager, config: ServerConfig,
                      state_dir: Path) -> Pruned | None:
    """Apply ``config.retention`` now (call after a checkpoint is written); what it dropped, or None."""
    if config.retention != "since_checkpoint":
        return None
    try:
        through = safe_step(checkpoints)
        after = int(store.get_meta(PRUNED_KEY, 0))
        if through <= after:
            return None
        exported = None
        if config.retention_export_dir:
            folder = state_dir / config.retention_export_dir  # an absolute dir stays as given
            exported = export_episodes(store.path, folder / f"episodes-steps-{after + 1}-{through}.parquet",
                                       "parquet", since_step=after + 1, through_step=through).path
        episodes, timelines = store.prune(through)
    except Exception:
        log.exception("retention: pruning after a checkpoint failed (nothing was pruned); the next "
                      "checkpoint tries again")
        return None
    log.info("retention: pruned %d episodes (%d timelines) trained at steps %d..%d", episodes, timelines, after + 1,
             through)
    return Pruned(after=after, through=through, episodes=episodes, timelines=timelines, exported=exported)
