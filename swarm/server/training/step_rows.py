"""The per-step metrics rows: the newest in memory, every one in the buffer.

A row is a few KB (one step's ``train/*``, ``perf/*``, ``eval/*`` ... metrics); days of steps would be
hundreds of MB held for nothing, so the server keeps the newest ``IN_MEMORY`` rows and reads older ones
back from the buffer (``step_metrics``), which keeps them all. A held-out round that ends after its step
committed merges its ``eval/*`` into that step's row, in memory or in the buffer, with its own x for a
chart per episode consumed: ``eval/episodes_total``, the step's ``train/episodes_total``. MLflow's UI pairs
a chart's x and y metrics by position in their histories, not by step, so a y logged every few steps
needs an x logged at exactly those steps (``train/episodes_total`` is logged at every step).
"""

from __future__ import annotations

from collections.abc import Callable

from swarm.protocol import StepMetrics
from swarm.server.durability.store import EpisodeStore, store_safely
from swarm.server.view import ServerView

IN_MEMORY = 1000
EVAL_EPISODES = "eval/episodes_total"  # a held-out round's x: the cumulative episodes of the step it evaluated
TRAIN_EPISODES = "train/episodes_total"  # swarm.server.training.ledger.TOTAL_EPISODES, written with each step


class StepRows:
    """Rows by step, in step order; the step loop appends, held-out rounds merge (``add``), readers
    read. ``view`` gives a new row its policy version and time."""

    def __init__(self, store: EpisodeStore, view: ServerView) -> None:
        self.store = store
        self.view = view
        self.rows: list[StepMetrics] = []  # the newest IN_MEMORY rows
        self.trimmed = False  # the buffer holds rows older than ``rows``

    def restore(self) -> None:
        """After a restart: the newest rows from the buffer (row 0, when kept, holds the held-out
        evaluation of the untrained policy)."""
        self.rows = [StepMetrics.model_validate_json(body) for body in self.store.newest_step_metrics(IN_MEMORY + 1)]
        self._trim()

    def append(self, row: StepMetrics) -> None:
        """A committed step's row (the step loop writes it to the buffer in the step's commit)."""
        self.rows.append(row)
        self._trim()

    def add(self, step: int, extra: dict[str, float]) -> StepMetrics:
        """Merge ``extra`` (a held-out round's ``eval/*``, which ends after its step committed) into the metrics
        row of ``step``, creating the row if there is none (step 0: the untrained policy), with
        ``EVAL_EPISODES``: the row's cumulative episodes (0 for the untrained policy), logged beside the
        round's metrics at the same step. A row without the count (written by an older server) gets none."""
        view = self.view

        def with_x(metrics: dict[str, float]) -> dict[str, float]:
            total = metrics.get(TRAIN_EPISODES, 0.0 if step == 0 else None)
            return {**extra, EVAL_EPISODES: total} if total is not None else dict(extra)

        return self.merge(step, with_x, lambda metrics: StepMetrics(
            step=step, policy_version=view.policy_version, time=view.clock(), metrics=metrics))

    def merge(self, step: int, extra: Callable[[dict[str, float]], dict[str, float]],
              new_row: Callable[[dict[str, float]], StepMetrics]) -> StepMetrics:
        """Merge ``extra(row's metrics)`` into the row of ``step``, creating it with ``new_row`` if there is none
        (``extra({})``; step 0: the untrained policy), and write the row to the buffer at once, so every
        reader sees it and a restart keeps it."""
        index = next((i for i in range(len(self.rows) - 1, -1, -1) if self.rows[i].step <= step), -1)
        if index >= 0 and self.rows[index].step == step:
            row = _merged(self.rows[index], extra)
            self.rows[index] = row
        elif index < 0 and self.trimmed:  # older than memory holds: merge into the buffer's row
            stored = [StepMetrics.model_validate_json(body) for body in self.store.step_metrics(step - 1, limit=1)]
            row = _merged(stored[0], extra) if stored and stored[0].step == step else new_row(extra({}))
        else:
            row = new_row(extra({}))
            self.rows.insert(index + 1, row)
        store_safely(f"save the metrics of step {step}", lambda: self.store.save_step_metrics(step, row.model_dump_json()))
        return row

    def since(self, since_step: int) -> list[StepMetrics]:
        """The rows of steps after ``since_step``; from the start (0) also row 0, the held-out evaluation
        of the untrained policy, which no later step reports any more. Rows older than memory holds
        come from the buffer (memory's win: a full disk may have kept one from the buffer)."""
        rows = self.rows
        if self.trimmed and (not rows or since_step < rows[0].step):
            after = -1 if since_step == 0 else since_step  # from the start: row 0 too
            stored = (StepMetrics.model_validate_json(body) for body in self.store.step_metrics(after))
            rows = sorted({**{m.step: m for m in stored}, **{m.step: m for m in rows}}.values(), key=lambda m: m.step)
        return [m for m in rows if m.step > since_step or m.step == since_step == 0]

    def _trim(self) -> None:
        extra = len(self.rows) - IN_MEMORY
        if extra > 0:
            del self.rows[:extra]
            self.trimmed = True


def _merged(row: StepMetrics, extra: Callable[[dict[str, float]], dict[str, float]]) -> StepMetrics:
    return row.model_copy(update={"metrics": {**row.metrics, **extra(row.metrics)}})
