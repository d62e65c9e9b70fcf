"""The server's own MLflow run (``swarm serve --mlflow-uri``): the one writer of its training run.

What goes in: the process settings and the live config at start as params (``model``, ``engine``,
``trainer``, ``seed``, ``lr``, ``group_size``, …), every key of ``GET /api/v1/metrics`` for every step
(read from the durable buffer, so what MLflow missed while unreachable goes out later, even after a
restart; step 0 too when it holds a held-out evaluation of the untrained policy), a tag per
checkpoint (``checkpoint/step-<N>`` and ``checkpoint/latest``: the directory) and per live config
change (``config/version-<V>``: the changed keys), and the end status: FINISHED on a stop, FAILED
when the server sees itself die (it could not start, or its training loop crashed).

Which run: ``--mlflow-run-id`` (the researcher's child run); else the run recorded in
``<state>/mlflow.json`` when the URI and experiment match (a restarted server continues its run,
status back to RUNNING); else a new run in ``--mlflow-experiment``. The delivery itself, its cursor
and its retries are ``swarm.tracking.MlflowRunWriter``'s; nothing here waits on MLflow.

Late rows: a held-out round that ends after its step's row went out adds ``eval/*`` to that row
(``swarm.server.episodes.evaluation``), always the newest step's. Its ``eval.finished`` event rewinds the
writer by that one step, so the row goes out again; a start rewinds by one step too, for a round
that ended just before a crash or stop, before delivery. Resending a step costs one small batch,
and MLflow keeps one copy of each point sent twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarm.config import ServerSettings
from swarm.protocol import StepMetrics
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.store import EpisodeStore
from swarm.tracking import SERVER_CURSOR_FILE, MlflowRunWriter

__all__ = ["CURSOR_FILE", "ServerRun", "server_params"]

CURSOR_FILE = SERVER_CURSOR_FILE
_CLOSE_TIMEOUT_S = 10.0  # a stop waits this long at most for MLflow; the rest goes out on the next start


def server_params(settings: ServerSettings, config: Mapping[str, object]) -> dict[str, object]:
    """The run's params: what the process was started with, then every live config key."""
    params: dict[str, object] = {"model": settings.model, "engine": settings.engine, "trainer": settings.trainer,
                              "seed": settings.seed, "device": settings.device, "dtype": settings.dtype}
    if settings.trainer == "verl":
        params["workers"] = settings.workers
    if settings.max_context is not None:
        params["max_context"] = settings.max_context
    return {**params, **config}


class ServerRun:
    """Feeds one ``MlflowRunWriter``: ``start`` before serving, ``watch`` the training task, ``close``
    on the way out; ``on_event`` receives the server's events. It is given the live config and step
    it starts at, the durable buffer (its step rows: ``store.step_metrics(after, limit)``, JSON
    documents) and the checkpoints (the kept ones: ``checkpoints.all()``, oldest first)."""

    def __init__(self, settings: ServerSettings, *, config: Mapping[str, object], step: int,
                 store: EpisodeStore, checkpoints: CheckpointManager) -> None:
        if not settings.mlflow_uri:
            raise ValueError("ServerRun needs settings.mlflow_uri")
        self._uri = settings.mlflow_uri
        self._settings = settings
        self._config = config
        self._step = step
        self._store = store
        self._checkpoints = checkpoints
        self._writer: MlflowRunWriter | None = None
        self._error: str | None = None

    @property
    def run_id(self) -> str | None:
        return self._writer.run_id if self._writer is not None else None

    def start(self) -> None:
        """Begin delivering in the background (returns at once, whatever the state of MLflow)."""
        settings = self._settings
        self._writer = MlflowRunWriter(
            self._uri, self._steps, run_id=settings.mlflow_run_id, experiment=settings.mlflow_experiment,
            run_name=f"swarm-{Path(settings.model).name}",
            params=server_params(settings, self._config),
            tags={"swarm.state_dir": str(settings.state_dir.resolve())},
            cursor_path=settings.state_dir / CURSOR_FILE, rewind_to=self._step)
        self._writer.rewind(self._writer.delivered_step - 1)  # the row at the cursor may have gained eval/*
        for checkpoint in self._checkpoints.all():  # kept ones, oldest first: saved while MLflow was away
            self._tag_checkpoint(checkpoint.step, checkpoint.path)

    def watch(self, task: asyncio.Task[Any]) -> None:
        """The run ends FAILED if ``task`` (the training loop) dies of an error."""
        task.add_done_callback(self._task_done)

    def close(self, error: str | None = None) -> bool:
        """End the run: FAILED with ``error`` (or a watched task's), else FINISHED. Blocks up to
        ``_CLOSE_TIMEOUT_S`` (call it off the event loop); ``True`` if everything was delivered."""
        if self._writer is None:
            return True
        error = error or self._error
        if error:
            self._writer.set_tag("swarm.error", error)
        return self._writer.close("FAILED" if error else "FINISHED", timeout_s=_CLOSE_TIMEOUT_S)

    def _steps(self, after: int, limit: int) -> list[StepMetrics]:
        """The writer's source: the durable buffer's step metrics (the same documents as /api/v1/metrics)."""
        return [StepMetrics.model_validate_json(body) for body in self._store.step_metrics(after, limit)]

    def on_event(self, type_: str, data: dict[str, Any]) -> None:
        """A server event (a core listener, ``ServerCore.add_listener``): checkpoints, late eval rows and config changes."""
        if self._writer is None:
            return
        if type_ == "checkpoint.saved":
            self._tag_checkpoint(int(data["step"]), Path(str(data["path"])))
        elif type_ == "eval.finished":  # the row of data["step"] gained eval/* (maybe after it went out)
            self._writer.rewind(int(data["step"]) - 1)
        elif type_ == "config.changed":
            self._writer.set_tag(f"config/version-{data['version']}", json.dumps(data["values"], sort_keys=True))

    def _tag_checkpoint(self, step: int, path: Path) -> None:
        assert self._writer is not None
        where = str(path.resolve())
        self._writer.set_tag(f"checkpoint/step-{step}", where)
        self._writer.set_tag("checkpoint/latest", where)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self._error = f"{task.get_name()} died: {type(exc).__name__}: {exc}"  # the app logs the traceback
