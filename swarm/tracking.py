"""MLflow writer for a swarm server: config as params, per-step metrics in batches, checkpoint tags.

Used when ``swarm serve --mlflow-uri`` (or ``MLFLOW_TRACKING_URI``) is given, so manual swarm use is
reviewable in the same UI as researcher studies. A background thread flushes with ``log_batch``
(one SQLite ``log_metric`` costs ~15 ms; a batch of 1,000 ~90 ms), so the training loop never waits
on the store, and a store that is briefly unreachable costs nothing: rows stay queued and are retried.
The researcher passes the id of a run it created (``run_id``) so each training run has one writer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


class MlflowRunWriter:
    """Owns one MLflow run; thread-safe ``log_step``; ``close`` flushes and sets the final status."""

    def __init__(
        self,
        tracking_uri: str,
        *,
        run_id: str | None = None,
        experiment: str = "swarm",
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        flush_every_s: float = 2.0,
    ) -> None:
        from mlflow.tracking import MlflowClient  # lazy: mlflow import costs ~1 s

        self._client = MlflowClient(tracking_uri=tracking_uri)
        if run_id is None:
            exp = self._client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp else self._client.create_experiment(experiment)
            run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
        self.run_id = run_id
        self._queue: queue.Queue[tuple[int, dict[str, float], float]] = queue.Queue()
        self._pending: list[Any] = []
        self._flush_every_s = flush_every_s
        self._stop = threading.Event()
        if params:
            self.log_params(params)
        self._thread = threading.Thread(target=self._loop, name="mlflow-writer", daemon=True)
        self._thread.start()

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._client.log_batch(self.run_id, params=items[start:start + 100])

    def set_tag(self, key: str, value: str) -> None:
        self._client.set_tag(self.run_id, key, value)

    def log_step(self, step: int, metrics: Mapping[str, float], timestamp: float | None = None) -> None:
        """Queue one step's metrics; returns at once."""
        self._queue.put((step, dict(metrics), timestamp or time.time()))

    def flush(self) -> None:
        """Write everything queued so far (retries later if the store is unreachable)."""
        from mlflow.entities import Metric

        while True:
            try:
                step, metrics, ts = self._queue.get_nowait()
            except queue.Empty:
                break
            millis = int(ts * 1000)
            self._pending.extend(Metric(k, float(v), millis, step) for k, v in metrics.items())
        while self._pending:
            chunk = self._pending[:1000]
            try:
                self._client.log_batch(self.run_id, metrics=chunk)
            except Exception as exc:  # the store may be down for a while; never lose rows or crash training
                logger.warning("MLflow store unreachable (%s); %d metrics kept for retry", exc, len(self._pending))
                return
            del self._pending[:1000]

    def close(self, status: str = "FINISHED") -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.flush()
        self._client.set_terminated(self.run_id, status)

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_every_s):
            self.flush()
