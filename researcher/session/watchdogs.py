"""Watchdogs for days-long studies, each a small function the study's context or a node calls.

- ``disk_low``: the artifacts disk is almost full (checkpoints would fail) -> park the study
  (``StudyContext.should_park``).
- ``client_stuck``: the server waits for episodes but none finished for a while while the client
  process still lives (a hung agent) -> restart the client (the ``monitor`` node).

A stalled server (no training step for ``stall_timeout_s``) is handled in the monitor itself. What a
failure means (a full disk, an exhausted LLM quota, a transient LLM error) and the signals that park or
fail a study are ``researcher.types.failures``: every layer, the planner included, tells them apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def disk_low(path: Path, min_free_mb: float) -> str | None:
    """A clear reason when the filesystem holding ``path`` has less than ``min_free_mb`` free."""
    if min_free_mb <= 0:
        return None
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_mb = shutil.disk_usage(probe).free / 2**20
    if free_mb < min_free_mb:
        return (f"disk almost full: {free_mb:.0f} MB free under {probe} (the study needs at least "
                f"{min_free_mb:.0f} MB); free some space and the next window resumes it")
    return None


def client_stuck(*, finished_now: int, finished_before: int, since: float, now: float, server_waiting: bool,
                 limit_s: float) -> bool:
    """No episode finished for ``limit_s`` while the server was waiting for episodes."""
    return server_waiting and finished_now <= finished_before and now - since > limit_s
