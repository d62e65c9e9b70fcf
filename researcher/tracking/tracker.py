"""The researcher's MLflow writer: one experiment per study, a parent run per iteration, a nested
child run per training run (config params, per-step metrics, client code and logs).

Uses ``MlflowClient`` with explicit run ids (never the fluent active-run stack), so a resumed
process can re-attach to the runs recorded in state and run.json, and close the stale ones left
RUNNING by a crash with ``set_terminated(run_id, "KILLED")``. Metrics go in ``log_batch`` chunks
(one SQLite transaction per poll instead of one per value).

With a spool folder, a write that fails because the store is unreachable is spooled to disk
(``researcher.tracking.spool``) and replayed later, instead of failing the study; a store error caused by
the write itself (an invalid value) is logged and dropped.

Nothing secret is uploaded: run.json holds no token (``researcher.runs.record``), and a server's credential
files (``token``, ``client_token``, ``secret``) are never uploaded, even inside a folder logged whole.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from researcher.tracking import review_view
from researcher.tracking.spool import Spool
from swarm.protocol import StepMetrics

log = logging.getLogger(__name__)
_BATCH = 1000  # MLflow's per-request metric limit
_REPLAY_EVERY_S = 30.0
DESCRIPTION = "mlflow.note.content"  # the tag MLflow's UI shows as a run's or experiment's description
CREATE_ID_TAG = "researcher.create_id"  # the id a run was first asked for under: its creation happens once
CREDENTIAL_FILES = frozenset({"token", "client_token", "secret"})  # what `swarm serve` keeps in its state dir
_CALLER_ERRORS = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST",
                  "INVALID_STATE"}


class Tracker:
    def __init__(self, uri: str, artifact_root: Path, spool_dir: Path | None = None) -> None:
        self.uri = uri
        self.artifact_root = artifact_root
        self.spool = Spool(spool_dir) if spool_dir is not None else None
        self._client: Any = None
        self._next_replay = 0.0
        self._context_moved: dict[str, set[str]] = {}  # per run: context/* keys seen non-zero (see log_steps)

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient  # slow import: only when something is logged

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    # ------------------------------------------------------------------ delivery

    def _deliver(self, op: str, args: Mapping[str, object]) -> Any:
        """Run one write now, or spool it when the store is unreachable (or earlier writes wait)."""
        if self.spool is None:
            return self._apply(op, args)
        if self.spool.pending() and not self.flush():
            self.spool.append(op, args)
            return None
        try:
            return self._apply(op, args)
        except Exception as exc:  # classified right below; anything else re-raises
            if not unreachable(exc):
                if _caller_error(exc):
                    log.warning("MLflow refused %s (dropped): %s", op, exc)
                    return None
                raise
            log.warning("MLflow store unreachable (%s); spooling %s to %s", type(exc).__name__, op, self.spool.folder)
            self._next_replay = time.monotonic() + _REPLAY_EVERY_S
            self.spool.append(op, args)
            return None

    def flush(self, force: bool = False) -> bool:
        """Replay the spool (at most every 30 s unless ``force``); True when nothing is left."""
        if self.spool is None or not self.spool.pending():
            return True
        if not force and time.monotonic() < self._next_replay:
            return False
        try:
            done = self.spool.replay(self._apply)
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._next_replay = time.monotonic() + _REPLAY_EVERY_S
            return False
        log.info("replayed %d spooled MLflow writes", done)
        return True

    def _run(self, run_id: str) -> str:
        real = self.spool.real_id(run_id) if self.spool else run_id
        if real is None:
            raise LookupError(f"run {run_id} was never created")
        return real

    def _apply(self, op: str, args: Mapping[str, Any]) -> Any:
        """One write; ``args`` are what ``_deliver`` was given (or their JSON, replayed from the spool)."""
        from mlflow.entities import Metric, Param

        if op == "create_run":
            return self._create_once(args)
        if op == "describe":
            self.client.set_experiment_tag(self.experiment_id(args["study_id"]), DESCRIPTION, args["text"][:5000])
            return None
        if op == "view":
            experiment = self.experiment_id(args["study_id"])
            found = self.client.get_experiment(experiment).tags.get(review_view.VIEW_TAG)
            created = json.loads(found)["createdAt"] if found else args["at_ms"]
            view = review_view.saved_view(args["metric"], created, args["at_ms"], args.get("axis", "step"))
            self.client.set_experiment_tag(experiment, review_view.VIEW_TAG, view)
            return None
        run_id = self._run(args["run_id"])
        if op == "params":
            items = [Param(k, v) for k, v in args["params"]]
            for i in range(0, len(items), 100):
                self.client.log_batch(run_id, params=items[i:i + 100])
        elif op == "metrics":
            metrics = [Metric(k, v, ts, step) for k, v, ts, step in args["metrics"]]
            for i in range(0, len(metrics), _BATCH):
                self.client.log_batch(run_id, metrics=metrics[i:i + _BATCH])
        elif op == "tags":
            for key, value in args["tags"].items():
                self.client.set_tag(run_id, key, value)
        elif op == "files":
            for path in map(Path, args["paths"]):
                if path.is_file() and path.name not in CREDENTIAL_FILES:
                    self.client.log_artifact(run_id, str(path), args["artifact_path"])
                elif path.is_dir():
                    self._log_folder(run_id, path, args["artifact_path"] or path.name)
        elif op == "text":
            self.client.log_text(run_id, args["text"], args["name"])
        elif op == "table":
            self.client.log_table(data=args["data"], artifact_file=args["name"], run_id=run_id)
        elif op == "end":
            self.client.set_terminated(run_id, args["status"])
        else:
            raise ValueError(f"unknown tracker op {op!r}")
        return None

    def _create_once(self, args: Mapping[str, Any]) -> str:
        """Create a run once, however often the write is retried. A run created with a local id carries
        it as a tag, so a retry whose earlier try reached the store but lost its answer (the store
        killed mid-request) finds that run instead of making a second one (the soak's duplicate_runs)."""
        local = args.get("local_id")
        if local and self.spool and self.spool.real_id(local):
            return str(self.spool.real_id(local))  # replayed before (a crash after create): not twice
        experiment = self.experiment_id(args["study_id"])
        tags = dict(args["tags"])
        if tags.get("mlflow.parentRunId"):
            tags["mlflow.parentRunId"] = self._run(tags["mlflow.parentRunId"])
        found = self.client.search_runs([experiment], filter_string=f"tags.`{CREATE_ID_TAG}` = '{local}'",
                                        max_results=1) if local else []
        if found:
            run_id = found[0].info.run_id
        else:
            tags |= {CREATE_ID_TAG: local} if local else {}
            run_id = self.client.create_run(experiment, run_name=args["name"], tags=tags).info.run_id
        if local and self.spool:
            self.spool.map_id(local, run_id)
        return str(run_id)

    def _log_folder(self, run_id: str, folder: Path, artifact_path: str) -> None:
        if not any(f.name in CREDENTIAL_FILES for f in folder.rglob("*")):
            self.client.log_artifacts(run_id, str(folder), artifact_path)
            return
        for file in sorted(f for f in folder.rglob("*") if f.is_file() and f.name not in CREDENTIAL_FILES):
            parent = file.parent.relative_to(folder).as_posix()
            self.client.log_artifact(run_id, str(file), artifact_path if parent == "." else f"{artifact_path}/{parent}")

    # ------------------------------------------------------------------ runs

    def experiment_id(self, study_id: str) -> str:
        found = self.client.get_experiment_by_name(study_id)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:"):
            # A sqlite store needs an explicit artifact location beside it (mlartifacts/<study>).
            path = self.artifact_root / study_id
            path.mkdir(parents=True, exist_ok=True)
            location = path.as_uri()
        return self.client.create_experiment(study_id, artifact_location=location,
                                            tags={review_view.KIND_TAG: review_view.TRAINING_KIND})

    def _create(self, study_id: str, name: str, tags: dict[str, str], description: str | None = None) -> str:
        if description:  # the run's description in MLflow's UI
            tags = {**tags, DESCRIPTION: description[:5000]}
        local = Spool.new_local_id() if self.spool else None
        run_id = self._deliver("create_run", {"study_id": study_id, "name": name, "tags": tags, "local_id": local})
        created = run_id or local
        if not isinstance(created, str):  # _deliver answers None only when it spooled, and a spool gives a local id
            raise RuntimeError(f"MLflow created no run for {name!r}")
        return created

    def describe_study(self, study_id: str, text: str) -> None:
        """The experiment's description in MLflow's UI: what the study asks and, once known, its answer."""
        self._deliver("describe", {"study_id": study_id, "text": text})

    def save_review_view(self, study_id: str, metric: str, axis: str = "step") -> None:
        """The experiment's saved view in MLflow's UI (``researcher.tracking.review_view``): its runs grouped by
        arm, ``metric`` (the verdict's) charted first against the judged ``axis``; saved again when the
        verdict's metric and axis are known."""
        self._deliver("view", {"study_id": study_id, "metric": metric, "axis": axis,
                               "at_ms": int(time.time() * 1000)})

    def report_markdown(self, study_id: str, run_id: str, report: str, figures: Sequence[str]) -> str:
        """Markdown for the experiment's description: a link to the runs grouped by arm (where the
        experiment holds that saved view), a link to the run's ``report`` artifact and its ``figures``
        (artifact paths) shown inline, as URLs relative to the MLflow UI's root (the UI renders
        descriptions as Markdown); "" while the store is unreachable or the run not created."""
        from urllib.parse import quote

        try:
            real = self.real_id(run_id)
            found = self.client.get_experiment_by_name(study_id) if real else None
        except Exception as exc:
            if unreachable(exc):
                return ""
            raise
        if found is None or real is None:
            return ""
        lines = []
        view = found.tags.get(review_view.VIEW_TAG)
        if view:
            page = review_view.experiment_page(found.experiment_id, with_view=True)
            lines.append(f"**Runs** grouped by arm: [{json.loads(view)['name']}](#{page}).")
        page = review_view.run_page(found.experiment_id, real, report)
        lines.append(f"**Report** with its figures: [{report}](#{page}) (artifacts of run `{real}`).")
        lines += [f"![{path}](get-artifact?path={quote(path, safe='')}&run_uuid={real})" for path in figures]
        return "\n\n".join(lines)

    def start_parent(self, study_id: str, iteration: int, tags: dict[str, str], description: str | None = None) -> str:
        return self._create(study_id, f"iteration-{iteration}",
                            {"researcher.study_id": study_id, "researcher.iteration": str(iteration),
                             "researcher.kind": "iteration", **tags}, description)

    def start_child(self, study_id: str, parent_run_id: str | None, name: str, params: Mapping[str, object],
                    tags: dict[str, str], description: str | None = None) -> str:
        all_tags = {"researcher.study_id": study_id, "researcher.kind": "training-run", **tags}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run_id = self._create(study_id, name, all_tags, description)
        self.log_params(run_id, params)
        return run_id

    def log_params(self, run_id: str, params: Mapping[str, object]) -> None:
        self._deliver("params", {"run_id": run_id, "params": [[str(k), str(v)[:6000]] for k, v in sorted(params.items())]})

    def log_steps(self, run_id: str, steps: Sequence[StepMetrics]) -> int:
        """Log per-step metrics (slash keys as the server names them); returns how many values.

        A ``context/*`` key (multi-turn merge counters) is left out while it has only been zero for the
        run: a run that never forks would otherwise fill MLflow's first chart section with flat zeros."""
        moved = self._context_moved.setdefault(run_id, set())
        moved.update(k for s in steps for k, v in s.metrics.items() if k.startswith("context/") and v != 0)
        metrics = [[key, float(value), int(s.time * 1000), s.step] for s in steps
                   for key, value in sorted(s.metrics.items()) if not key.startswith("context/") or key in moved]
        if metrics:
            self._deliver("metrics", {"run_id": run_id, "metrics": metrics})
        return len(metrics)

    def log_values(self, run_id: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        metrics = [[k, float(v), now, step] for k, v in sorted(values.items())]
        if metrics:
            self._deliver("metrics", {"run_id": run_id, "metrics": metrics})

    def set_tags(self, run_id: str | None, tags: dict[str, str]) -> None:
        if run_id and tags:
            self._deliver("tags", {"run_id": run_id, "tags": {k: str(v) for k, v in tags.items()}})

    def log_files(self, run_id: str, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        self._deliver("files", {"run_id": run_id, "paths": [str(p) for p in paths], "artifact_path": artifact_path})

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self._deliver("text", {"run_id": run_id, "text": text, "name": name})

    def log_table(self, run_id: str, data: dict[str, list[Any]], name: str) -> None:
        """One table artifact (columns of equal length; MLflow's table view renders it)."""
        self._deliver("table", {"run_id": run_id, "data": data, "name": name})

    def end(self, run_id: str | None, status: str = "FINISHED") -> None:
        """Close a run (FINISHED, FAILED or KILLED); closing a closed run again is harmless."""
        if run_id:
            self._deliver("end", {"run_id": run_id, "status": status})

    def real_id(self, run_id: str | None) -> str | None:
        """The MLflow id behind a (possibly local, spooled) run id; None while it is not created."""
        return self.spool.real_id(run_id) if self.spool else run_id

    def close_stale(self, study_id: str, keep: set[str]) -> list[str]:
        """Mark runs a crash left RUNNING as KILLED, except those we re-attach to (``keep``)."""
        try:
            found = self.client.get_experiment_by_name(study_id)
            if found is None:
                return []
            stale = self.client.search_runs([found.experiment_id], filter_string="attributes.status = 'RUNNING'",
                                            max_results=1000)
        except Exception as exc:
            if unreachable(exc):
                log.warning("MLflow unreachable; stale runs of %s stay open for now: %s", study_id, exc)
                return []
            raise
        keep = keep | {r for r in (self.real_id(k) for k in keep) if r}
        closed = []
        for run in stale:
            if run.info.run_id not in keep:
                self.client.set_terminated(run.info.run_id, "KILLED")
                closed.append(run.info.run_id)
        if closed:
            log.info("closed %d stale MLflow runs of %s as KILLED", len(closed), study_id)
        return closed


def _caller_error(exc: BaseException) -> bool:
    from mlflow.exceptions import MlflowException

    return isinstance(exc, MlflowException) and exc.error_code in _CALLER_ERRORS


def unreachable(exc: BaseException) -> bool:
    """The store could not be reached or answered with a server-side failure (worth a later retry)."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, OSError):  # includes requests' connection errors
        return True
    return isinstance(exc, MlflowException) and exc.error_code not in _CALLER_ERRORS
