"""A training step's bookkeeping that a full disk kept out of the buffer, held until it can be written.

Why: by the time a step's episodes, policy version and metrics are committed
(``EpisodeStore.commit_step``) its update has happened. Were that commit forgotten because the disk
was full, the buffer would keep those episodes as untrained and a later restart would train them
twice. So ``StepCommits`` keeps such a commit, in step order, and the step loop writes it before the
next step starts or a checkpoint is taken (``flush``), waiting while the disk stays full (one try a
``diskspace.RETRY_AFTER_S``). Any other failure is logged and the commit given up, as before: a
restart then retrains the step from the checkpoint before it.
"""

from __future__ import annotations

import errno
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swarm.server.durability.diskspace import DiskMonitor, is_disk_full
from swarm.server.durability.store import EpisodeStore

log = logging.getLogger(__name__)

__all__ = ["StepCommit", "StepCommits"]


@dataclass(frozen=True)
class StepCommit:
    """What ``EpisodeStore.commit_step`` writes for one step."""

    step: int
    trained: list[str]
    metrics: str
    dropped: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class StepCommits:
    """Step commits in order; those a full disk refused wait here for the next ``flush``. ``on_full``
    is called when a step's commit is first refused (the step loop reports it), not on each retry."""

    def __init__(self, store: EpisodeStore, disk: DiskMonitor, on_full: Callable[[int, Exception], None]) -> None:
        self._store = store
        self._disk = disk
        self._on_full = on_full
        self._pending: deque[StepCommit] = deque()
        self._refused: int | None = None  # the step whose refusal was reported

    @property
    def pending(self) -> int:
        """Steps trained whose commit waits for disk space."""
        return len(self._pending)

    def commit(self, record: StepCommit) -> bool:
        """Write ``record`` after any that wait; ``False`` when it must wait for space too."""
        self._pending.append(record)
        return self.flush()

    def flush(self) -> bool:
        """Write the waiting commits in step order; ``True`` when none is left waiting."""
        while self._pending:
            head = self._pending[0]
            try:
                self._store.commit_step(head.step, head.trained, dropped=head.dropped, meta=head.meta,
                                        metrics=head.metrics)
            except Exception as exc:
                if is_disk_full(exc):
                    self._disk.failed(f"committing step {head.step}", exc)
                    if self._refused != head.step:
                        self._refused = head.step
                        self._on_full(head.step, exc)
                    return False
                log.exception("durable buffer: committing step %d failed", head.step)  # a restart retrains it
            else:
                self._disk.succeeded()
            self._refused = None
            self._pending.popleft()
        return True

    def require_written(self) -> None:
        """Raise ENOSPC unless every step is committed: a checkpoint must not name a step the buffer
        does not know (a restart from it would train that step's episodes again)."""
        if not self.flush():
            raise OSError(errno.ENOSPC, f"the disk is full: {self.pending} trained step(s) wait to be committed "
                                        "to the buffer; no checkpoint until they are")
