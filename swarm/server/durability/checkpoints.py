"""Crash-safe checkpoint directories: ``<root>/step-<N>/`` with ``weights/`` and ``meta.json``.

Why: a server SIGKILLed while writing a checkpoint must restart from the previous complete one, never
from half-written weights. So a checkpoint is built in a hidden temporary directory (the backend
writes its weights and optimizer state into ``weights/``, then ``meta.json`` goes in last) and only
then renamed to ``step-<N>`` in one ``rename`` — a directory either is a complete checkpoint or does
not carry a ``step-`` name. ``latest()`` also requires a readable ``meta.json`` whose step matches
the name, so a directory copied or truncated by hand is skipped too. Old checkpoints are pruned to
the newest ``keep``; leftovers of killed writes are removed when the manager is created.

A checkpoint is what a restart resumes from, so it is also made durable against an OS crash or a
power loss: every file and folder of the temporary directory is fsynced before the rename and the
root after it (``swarm.models.folders.fsync_tree``; published weights, by contrast, are not).

A checkpoint that has its name but does not load (a disk that lost or truncated a file, a hand
edit) is set aside by ``quarantine`` as ``.bad-step-<N>`` in the same root, never deleted: a restart
then resumes from the one before it, and the bad one stays for a post-mortem. One writer per root is
assumed (the server holds its state dir).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.models.folders import fsync_dir, fsync_tree

log = logging.getLogger(__name__)

__all__ = ["Checkpoint", "CheckpointError", "CheckpointManager"]

_NAME = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_BAD_PREFIX = ".bad-"
_FORMAT = 1


class CheckpointError(ValueError):
    """Bad arguments or an unreadable checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk and its metadata."""

    path: Path
    step: int
    policy_version: int
    time: float
    config: dict[str, Any] = field(default_factory=dict)
    server_state: dict[str, Any] = field(default_factory=dict)  # the buffer cursor, config version, max version

    @property
    def weights_dir(self) -> Path:
        """What ``write_weights`` filled; hand it to ``Trainer.load``."""
        return self.path / "weights"


class CheckpointManager:
    """Writes, finds and prunes checkpoints under ``root``."""

    def __init__(self, root: str | Path, keep: int = 3) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()

    def save(
        self,
        step: int,
        policy_version: int,
        write_weights: Callable[[Path], None],
        server_state: dict[str, Any],
        config: dict[str, Any] | None = None,
    ) -> Path:
        """Write checkpoint ``step`` and return its directory. ``write_weights(dir)`` fills the
        (existing, empty) ``weights/`` directory. Saving a step that exists replaces it. If anything
        raises, the temporary directory is removed and earlier checkpoints are untouched."""
        if step < 0 or policy_version < 0:
            raise CheckpointError(f"step and policy_version must be >= 0, got {step}, {policy_version}")
        meta = {
            "format": _FORMAT, "step": step, "policy_version": policy_version, "time": time.time(),
            "config": config or {}, "server_state": server_state,
        }
        try:  # fail before the (slow) weights are written, not after
            meta_text = json.dumps(meta, indent=2, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"server_state and config must be plain JSON: {exc}") from None

        tmp = self.root / f"{_TMP_PREFIX}step-{step}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            (tmp / "weights").mkdir()
            write_weights(tmp / "weights")
            (tmp / "meta.json").write_text(meta_text)
            fsync_tree(tmp)  # the data is on disk before a name says the checkpoint is complete
            final = self.root / f"step-{step}"
            if final.exists():
                # rename() will not replace a non-empty directory: move the old one aside first.
                trash = self.root / f"{_TRASH_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, trash)
                os.rename(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.rename(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("checkpoint step %d (policy version %d) written to %s", step, policy_version, final)
        self.prune()
        return final

    def all(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest first."""
        found: list[Checkpoint] = []
        for entry in self.root.iterdir():
            match = _NAME.match(entry.name)
            if not match or not entry.is_dir():
                continue
            try:
                checkpoint = self.load_meta(entry)
            except CheckpointError as exc:
                log.warning("skipping incomplete checkpoint %s: %s", entry, exc)
                continue
            if checkpoint.step == int(match.group(1)):
                found.append(checkpoint)
        return sorted(found, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        complete = self.all()
        return complete[-1] if complete else None

    def newest_first(self) -> list[Path]:
        """Every ``step-<N>`` directory, newest first, whether its ``meta.json`` reads or not: what a
        restart tries in turn (``load_meta``, then the trainer's load) until one loads."""
        named = [(int(m.group(1)), entry) for entry in self.root.iterdir()
                 if (m := _NAME.match(entry.name)) and entry.is_dir()]
        return [entry for _, entry in sorted(named, reverse=True)]

    def quarantine(self, path: str | Path) -> Path:
        """Rename a checkpoint that does not load to ``.bad-step-<N>`` beside it (a suffix is added
        if that name is taken) and return the new path. It stops counting as a checkpoint and is
        never pruned: only the operator deletes it."""
        path = Path(path)
        target = self.root / f"{_BAD_PREFIX}{path.name}"
        if target.exists():
            target = self.root / f"{_BAD_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, target)
        fsync_dir(self.root)
        log.warning("quarantined checkpoint %s as %s", path, target)
        return target

    @staticmethod
    def load_meta(path: str | Path) -> Checkpoint:
        """Read a checkpoint directory's ``meta.json``; ``CheckpointError`` if missing or malformed."""
        path = Path(path)
        try:
            meta = json.loads((path / "meta.json").read_text())
            return Checkpoint(
                path=path, step=int(meta["step"]), policy_version=int(meta["policy_version"]),
                time=float(meta["time"]), config=dict(meta.get("config") or {}),
                # "engine_state": the key's name before 0.1 (the server core was called the engine)
                server_state=dict(meta.get("server_state") or meta.get("engine_state") or {}),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: no readable meta.json ({exc})") from None

    def prune(self) -> list[Path]:
        """Delete all but the newest ``keep`` complete checkpoints, and incomplete ``step-`` dirs older
        than the oldest kept one. Returns what was removed."""
        complete = self.all()
        kept = complete[-self.keep:]
        oldest_kept = kept[0].step if kept else -1
        keep_paths = {c.path for c in kept}
        removed: list[Path] = []
        for entry in self.root.iterdir():
            match = _NAME.match(entry.name)
            if match and entry not in keep_paths and int(match.group(1)) < oldest_kept:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
        return removed

    def _remove_leftovers(self) -> None:
        for entry in self.root.iterdir():
            if entry.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                log.info("removing leftover of an interrupted checkpoint: %s", entry)
                shutil.rmtree(entry, ignore_errors=True)
