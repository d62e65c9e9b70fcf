"""``StepLedger``: the committed steps: their count, their metrics rows and the durable record of each.

Durability: before an update the next version id is reserved in the buffer (``reserve_version``: with
the default shared torch backend a completion can be tagged with it before the step commits, and a
restart must never hand the same id to different weights); after it, ``commit`` writes the trained and
dropped episodes, the version and the step's metrics row in one transaction
(``EpisodeStore.commit_step``). A crash between the update and the commit therefore loses the whole
step (its episodes train again after a restart) and never half of it. A commit a full disk refuses
waits, in order, until it can be written (``StepCommits``); no step or checkpoint starts before it is.

Why the wait: by the time a step's commit is written its update has happened. Were that commit
forgotten because the disk was full, the buffer would keep those episodes as untrained and a later
restart would train them twice. So ``StepCommits`` keeps such a commit, in step order, and the step
loop writes it before the next step starts or a checkpoint is taken (``flush``), waiting while the disk
stays full (one try a ``diskspace.RETRY_AFTER_S``). Any other failure is logged and the commit given
up: a restart then retrains the step from the checkpoint before it.

Beside each step's own metrics (``swarm.server.training.step.step_metrics``) the ledger adds what only the
sequence of steps knows (``counters``): cumulative episodes and samples, the step's duration, the
episode rate since the previous step and the capacity meter's figures.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarm.protocol import StepMetrics
from swarm.server.durability.diskspace import DiskMonitor, is_disk_full
from swarm.server.durability.recovery import MAX_VERSION_KEY
from swarm.server.durability.store import EpisodeStore
from swarm.server.flow.capacity import CapacityMeter
from swarm.server.records.episode import EpisodeRecord
from swarm.server.training.step_rows import TRAIN_EPISODES, StepRows
from swarm.server.view import ServerView

log = logging.getLogger(__name__)

__all__ = ["TOTAL_EPISODES", "TOTAL_SAMPLES", "Reporter", "StepCommit", "StepCommits", "StepLedger"]

# Cumulative per-step metrics (see StepLedger.counters).
TOTAL_EPISODES = TRAIN_EPISODES  # "train/episodes_total", also the x of a held-out round's chart
TOTAL_SAMPLES = "train/samples_total"


class Reporter(Protocol):
    """Where a refused commit is reported (``swarm.server.training.error_log.ErrorLog``)."""

    def report(self, where: str, exc: BaseException) -> None: ...


@dataclass(frozen=True)
class StepCommit:
    """What ``EpisodeStore.commit_step`` writes for one step."""

    step: int
    trained: list[str]
    metrics: str
    dropped: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class StepCommits:
    """Step commits in order; those a full disk refused wait here for the next ``flush``. A step's
    commit first refused is reported to ``errors`` (``where=commit``), not each retry."""

    def __init__(self, store: EpisodeStore, disk: DiskMonitor, errors: Reporter) -> None:
        self._store = store
        self._disk = disk
        self._errors = errors
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
                        self._errors.report("commit", exc)
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


class StepLedger:
    """The step counter, the metrics rows (shared with held-out evaluation, which merges its rounds
    in) and each step's durable commit."""

    def __init__(self, view: ServerView, *, store: EpisodeStore, disk: DiskMonitor, rows: StepRows,
                 capacity: CapacityMeter, errors: Reporter) -> None:
        self._view = view
        self.store = store
        self.disk = disk  # says when a failed write was for want of space
        self.rows = rows  # the step metrics: the newest in memory, all in the buffer
        self._capacity = capacity
        self.commits = StepCommits(store, disk, errors)
        self.step = 0  # the last committed step
        self.last_step_at = time.monotonic()

    def reserve_version(self, version: int) -> None:
        """Record ``version`` as handed out before the update that makes it (a full disk raises)."""
        self.store.put_meta(MAX_VERSION_KEY, version)

    def counters(self, episodes: int, samples: int, started: float) -> dict[str, float]:
        """What the sequence of steps adds to the next step's metrics (module docstring); ``started``:
        when the step began (``time.perf_counter``)."""
        step_s = time.perf_counter() - started
        metrics = {**self._totals(self.step + 1, episodes, samples), "perf/step_s": step_s,
                   "perf/episodes_per_s": episodes / max(time.monotonic() - self.last_step_at, 1e-9)}
        return {**metrics, **self._capacity.step_finished(step_s)}

    def commit(self, kept: list[EpisodeRecord], stale: list[EpisodeRecord], reason: str,
               metrics: dict[str, float]) -> StepMetrics:
        """The next step happened: write what it trained (``kept``) and dropped (``stale``, for
        ``reason``), its version and ``metrics`` (a refused write waits, ``StepCommits``); its row."""
        view, step = self._view, self.step + 1
        row = StepMetrics(step=step, policy_version=view.policy_version, time=view.clock(), metrics=metrics)
        dropped = {reason: [e.episode_id for e in stale]} if stale else {}
        self.commits.commit(StepCommit(step, [e.episode_id for e in kept], row.model_dump_json(), dropped=dropped,
                                       meta={MAX_VERSION_KEY: view.policy_version}))
        self.step = step
        self.last_step_at = time.monotonic()
        self.rows.append(row)
        return row

    def _totals(self, step: int, episodes: int, samples: int) -> dict[str, float]:
        """Cumulative counts through ``step``: the x-axis for judging learning per episode consumed
        (MLflow plots against step or time only). They continue the last committed row before
        ``step``, so a restart that retrains steps after its checkpoint counts them once."""
        before = next((m.metrics for m in reversed(self.rows.rows) if m.step < step and TOTAL_EPISODES in m.metrics),
                      {})
        return {TOTAL_EPISODES: before.get(TOTAL_EPISODES, 0.0) + episodes,
                TOTAL_SAMPLES: before.get(TOTAL_SAMPLES, 0.0) + samples}
