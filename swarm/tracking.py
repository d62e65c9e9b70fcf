"""One MLflow run written from a background thread: params once, per-step metrics in batches, tags and
the final status.

Used by ``swarm serve --mlflow-uri`` (``swarm.server.mlflow_sink``), so manual swarm use is reviewable in
the same UI as researcher studies, and a researcher's child run (``run_id``) has exactly one writer.

Why a thread and a cursor: the server must never wait on its tracking store, and an unreachable store
must cost nothing but delay. The writer keeps no copy of the metrics: it reads the steps after its
cursor from a ``source`` (the server's durable buffer), sends them with ``log_batch`` (one SQLite
``log_metric`` costs ~15 ms, a batch of 1,000 ~90 ms) and records the last delivered step in a small
JSON cursor file. The source IS the spool: while MLflow is down nothing is lost and nothing piles up
in memory, and after a restart on the same cursor the same run is reopened (status back to RUNNING)
and delivery resumes where it stopped. Sending a step twice is harmless: MLflow stores a metric with
the same key, step, timestamp and value once.

Nothing here blocks the caller. The constructor only reads the cursor file; importing mlflow (~1 s),
opening or creating the run and every write happen on the thread, retried with backoff (at most
``_RETRY_MAX_S`` apart) while the store is unreachable. A refusal (an unknown or deleted run) is
logged and ends the writer, never raises into the server. ``close`` is bounded in time: what is not
delivered when it gives up stays in the source and goes out on the next start.

MLflow's own HTTP client also retries a dead server, for minutes by default
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES=7`` with exponential backoff); those retries run on this thread
too. Set ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` to let this writer's shorter retry notice a returning
server within seconds.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swarm.atomic import write_atomic
from swarm.protocol import StepMetrics

log = logging.getLogger(__name__)

__all__ = ["SERVER_CURSOR_FILE", "MlflowRunWriter", "StepSource", "delivered_step"]

StepSource = Callable[[int, int], Sequence[StepMetrics]]
"""``source(after_step, limit)``: up to ``limit`` steps after ``after_step``, in step order."""

_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_PARAMS_PER_BATCH = 100
_TAGS_PER_BATCH = 100
_STEPS_PER_READ = 200
_RETRY_MAX_S = 5.0
_MAX_VALUE_CHARS = 6000  # MLflow caps param values at 6,000 characters and tag values at 8,000
# Error codes of a store that answered and refused the request: retrying cannot help.
_REFUSALS = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST",
             "INVALID_STATE", "PERMISSION_DENIED", "UNAUTHENTICATED"}


SERVER_CURSOR_FILE = "mlflow.json"  # a server's cursor, in its state dir


def delivered_step(cursor_path: Path, run_id: str | None = None) -> int:
    """The last step a writer's cursor says MLflow acknowledged: 0 without a cursor, or when it is
    another run's. A server stopped while its store was away leaves the steps after it undelivered
    (``close`` gives up in bounded time): whoever ends the run for good delivers them (the researcher)."""
    cursor = _Cursor.load(cursor_path)
    if cursor is None or (run_id is not None and cursor.run_id != run_id):
        return 0
    return cursor.delivered_step


class _GiveUp(Exception):
    """The writer cannot go on (a refusal, mlflow missing); logged once, never raised to callers."""


@dataclass
class _Cursor:
    """What went out to which run; ``<state>/mlflow.json`` for the server."""

    tracking_uri: str
    experiment: str
    run_id: str | None = None
    params_logged: bool = False
    delivered_step: int = 0

    @classmethod
    def load(cls, path: Path) -> _Cursor | None:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable MLflow cursor %s (%s): a new run will be created", path, exc)
            return None

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=2))


class MlflowRunWriter:
    """Owns one MLflow run: opens or creates it lazily, then delivers the ``source``'s steps, the
    params (once per run) and queued tags every ``flush_every_s``; ``close`` sets the final status.

    ``run_id``: write into this existing run (the researcher's child run). Otherwise the run recorded
    in ``cursor_path`` is reused when the tracking URI and experiment match, else a new run is created
    in ``experiment``. ``rewind_to``: the source forgot every step after this one since the cursor was
    written (a restart rolled them back), so steps after it are delivered again."""

    def __init__(self, tracking_uri: str, source: StepSource, *, run_id: str | None = None,
                 experiment: str = "swarm", run_name: str | None = None, params: Mapping[str, Any] | None = None,
                 tags: Mapping[str, str] | None = None, cursor_path: Path | None = None,
                 rewind_to: int | None = None, flush_every_s: float = 2.0) -> None:
        self.tracking_uri = tracking_uri
        self._source = source
        self._explicit_run = run_id
        self._run_name = run_name
        self._params = {str(k): str(v)[:_MAX_VALUE_CHARS] for k, v in (params or {}).items()}
        self._cursor_path = cursor_path
        self._flush_every_s = flush_every_s
        saved = _Cursor.load(cursor_path) if cursor_path is not None else None
        if saved is not None and ((saved.tracking_uri, saved.experiment) != (tracking_uri, experiment)
                                  or (run_id is not None and saved.run_id != run_id)):
            saved = None  # another store, experiment or run: its cursor says nothing about this one
        self._cursor = saved or _Cursor(tracking_uri, experiment, run_id)
        self._tags: dict[str, str] = {}
        self._rewind: int | None = None  # set by ``rewind``; applied by the thread before its next read
        self._lock = threading.Lock()
        for key, value in (tags or {}).items():
            self.set_tag(key, value)
        if rewind_to is not None and self._cursor.delivered_step > rewind_to:
            self.set_tag("swarm.rolled_back", f"steps {rewind_to + 1}-{self._cursor.delivered_step} were logged "
                         "before a restart rolled them back; later points at those steps are the live ones")
            self._cursor.delivered_step = rewind_to
        self._client: Any = None
        self._existing_params: dict[str, str] = {}
        self._status = "FINISHED"
        self._deadline = math.inf
        self._ended = False
        self._abandoned = False
        self._unreachable_since: float | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlflow-writer", daemon=True)
        self._thread.start()

    @property
    def run_id(self) -> str | None:
        """The run written to (``None`` until it has been opened or created)."""
        return self._cursor.run_id

    @property
    def delivered_step(self) -> int:
        """The last step whose metrics the store acknowledged."""
        return self._cursor.delivered_step

    def set_tag(self, key: str, value: str) -> None:
        """Queue a tag (sent with the next delivery); returns at once."""
        with self._lock:
            self._tags.pop(key, None)  # re-insert: the newest value goes out last
            self._tags[key] = str(value)[:_MAX_VALUE_CHARS]

    def rewind(self, step: int) -> None:
        """Send the source's steps after ``step`` again with the next delivery (soon): a step the
        source revised after it went out. MLflow keeps one copy of a point sent twice."""
        with self._lock:
            self._rewind = step if self._rewind is None else min(self._rewind, step)
        self._wake.set()

    def close(self, status: str = "FINISHED", timeout_s: float = 10.0) -> bool:
        """Deliver what is left, set the run's final ``status`` and stop, waiting at most ``timeout_s``.
        ``True`` if everything went out; else the rest stays in the source for the next start."""
        self._status = status
        self._deadline = time.monotonic() + timeout_s
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s + 1.0)
        self._abandoned = self._thread.is_alive()
        if not self._ended:
            log.warning("MLflow run %s not closed%s: steps after %d stay in the buffer for the next start",
                        self.run_id, f" within {timeout_s:.0f} s" if self._abandoned else "", self.delivered_step)
        return self._ended

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        delay = self._flush_every_s
        while not self._abandoned:
            stopping = self._stop.is_set()
            try:
                self._deliver()
                if stopping:
                    self._client.set_terminated(self.run_id, self._status)
                    self._ended = True
                    log.info("MLflow run %s ended %s at step %d", self.run_id, self._status, self.delivered_step)
                    return
                if self._unreachable_since is not None:
                    log.info("MLflow store reachable again after %.0f s; delivered through step %d",
                             time.monotonic() - self._unreachable_since, self.delivered_step)
                    self._unreachable_since = None
                delay = self._flush_every_s
            except _GiveUp as exc:
                log.error("MLflow writer stopped: %s; the server's metrics stay in its buffer (GET /api/v1/metrics)",
                          exc)
                return
            except Exception as exc:
                if self._abandoned:
                    return  # the owner has moved on (its source may be closed): nothing to report
                if not _unreachable(exc):
                    log.exception("MLflow writer stopped by an unexpected error")
                    return
                if self._unreachable_since is None:
                    self._unreachable_since = time.monotonic()
                    log.warning("MLflow store %s unreachable (%s); steps after %d are kept in the buffer and "
                                "retried", self.tracking_uri, _short(exc), self.delivered_step)
                delay = min(max(delay * 2, 1.0), _RETRY_MAX_S)
                if stopping:
                    delay = min(delay, 0.5)
                    if time.monotonic() + delay > self._deadline:
                        return
            self._wake.wait(delay)
            self._wake.clear()

    def _deliver(self) -> None:
        if self._client is None:
            self._open()
        self._log_params()
        self._log_tags()
        self._log_steps()

    def _open(self) -> None:
        try:
            from mlflow.tracking import MlflowClient  # lazy: the import costs ~1 s
        except ImportError as exc:
            raise _GiveUp(f"mlflow is not installed ({exc})") from None
        try:
            client = MlflowClient(tracking_uri=self.tracking_uri)
        except Exception as exc:
            if _unreachable(exc):
                raise
            raise _GiveUp(f"cannot use the tracking URI {self.tracking_uri!r}: {_short(exc)}") from None
        run = None
        if self._cursor.run_id is not None:
            try:
                run = client.get_run(self._cursor.run_id)
            except Exception as exc:
                if _unreachable(exc):
                    raise
                if self._explicit_run is not None:
                    raise _GiveUp(f"run {self._explicit_run} cannot be opened: {_short(exc)}") from None
            if run is not None and run.info.lifecycle_stage != "active":
                if self._explicit_run is not None:
                    raise _GiveUp(f"run {self._explicit_run} is deleted")
                run = None
        if run is None:
            experiment_id = _experiment_id(client, self._cursor.experiment, self.tracking_uri)
            run = client.create_run(experiment_id, run_name=self._run_name)
            if self._cursor.run_id is not None:
                log.warning("MLflow run %s is gone; logging to a new run %s", self._cursor.run_id, run.info.run_id)
            self._cursor = _Cursor(self.tracking_uri, self._cursor.experiment, run.info.run_id)
        elif run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status="RUNNING")
        self._existing_params = dict(run.data.params)
        self._client = client
        self._save()
        log.info("MLflow run %s in %s (delivering after step %d)", self.run_id, self.tracking_uri,
                 self.delivered_step)

    def _log_params(self) -> None:
        """Once per run. A key the run already holds (the researcher logged its config) is kept."""
        if self._cursor.params_logged:
            return
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in self._params.items() if k not in self._existing_params]
        try:
            for start in range(0, len(items), _PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=items[start:start + _PARAMS_PER_BATCH])
        except Exception as exc:
            if _unreachable(exc):
                raise
            log.warning("MLflow refused the server's params (%s); they are skipped", _short(exc))
        self._cursor.params_logged = True
        self._save()

    def _log_tags(self) -> None:
        from mlflow.entities import RunTag

        with self._lock:
            pending, self._tags = self._tags, {}
        items = list(pending.items())
        try:
            for start in range(0, len(items), _TAGS_PER_BATCH):
                chunk = items[start:start + _TAGS_PER_BATCH]
                self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in chunk])
                for key, _ in chunk:
                    del pending[key]
        except Exception as exc:
            if _unreachable(exc):
                with self._lock:  # keep them; a value set meanwhile is newer and wins
                    self._tags = {**pending, **self._tags}
                raise
            log.warning("MLflow refused tags %s (%s); they are dropped", sorted(pending), _short(exc))

    def _log_steps(self) -> None:
        from mlflow.entities import Metric

        with self._lock:
            rewind, self._rewind = self._rewind, None
        if rewind is not None:
            self._cursor.delivered_step = min(self._cursor.delivered_step, rewind)
        while not self._abandoned:
            steps = self._source(self.delivered_step, _STEPS_PER_READ)
            if not steps:
                return
            batch: list[Any] = []
            for record in steps:
                millis = int(record.time * 1000)
                metrics = [Metric(k, float(v), millis, record.step) for k, v in sorted(record.metrics.items())]
                if batch and len(batch) + len(metrics) > _METRICS_PER_BATCH:
                    self._send(batch, batch[-1].step)
                    batch = []
                while len(metrics) > _METRICS_PER_BATCH:  # a step with more keys than one request holds
                    self._send(metrics[:_METRICS_PER_BATCH], None)
                    metrics = metrics[_METRICS_PER_BATCH:]
                batch.extend(metrics)
            self._send(batch, steps[-1].step)
            if len(steps) < _STEPS_PER_READ:
                return

    def _send(self, metrics: list[Any], through_step: int | None) -> None:
        """One ``log_batch``; the cursor moves once a step's last metric is acknowledged."""
        try:
            if metrics:
                self._client.log_batch(self.run_id, metrics=metrics)
        except Exception as exc:
            if _unreachable(exc):
                raise
            raise _GiveUp(f"MLflow refused the metrics of run {self.run_id}: {_short(exc)}") from None
        if through_step is not None:
            self._cursor.delivered_step = through_step
            self._save()

    def _save(self) -> None:
        if self._cursor_path is not None:
            self._cursor.save(self._cursor_path)


def _experiment_id(client: Any, name: str, tracking_uri: str) -> str:
    """The experiment's id, creating it (a SQLite store gets its artifacts beside the database,
    ``mlartifacts/<name>``, instead of MLflow's default under the current directory)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = None
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///").split("?")[0]).resolve()
        location = (database.parent / "mlartifacts" / name).as_uri()
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except Exception as exc:
        found = client.get_experiment_by_name(name)  # created by another writer meanwhile
        if found is None:
            raise exc from None
        return str(found.experiment_id)


def _unreachable(exc: BaseException) -> bool:
    """The store could not be reached or failed on its side: worth a later retry."""
    if isinstance(exc, OSError):
        return True
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.error_code not in _REFUSALS


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"
