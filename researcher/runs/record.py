"""run.json: the durable record of one training run (its key, processes, progress and outcome).

The record is the idempotency anchor of ``launch_runs``: a run whose run.json exists was launched
and is re-attached to, never launched again. ``launches`` counts server starts (tests assert it
stays 1 across a researcher crash). Writes are atomic (temp file + rename).

run.json holds no credential (it is uploaded to MLflow): our servers keep their tokens in their
state dir, named by ``state_dir``. A run.json written before that rule may carry a ``token``; it
is dropped on load (the next save writes the file without it) and, for our own server, kept in
the state dir's 0600 token file instead, where the launcher and a restarted server find it.
Loading never rewrites run.json: readers (`researcher status`) may load while the researcher
writes. Run dirs are created 0700.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from researcher.findings.records import JsonObject
from researcher.runs.status import ENDED, RunStatus
from swarm.atomic import write_atomic

RUN_FILE = "run.json"


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str                              # study/iteration/trial
    study_id: str
    iteration: int
    trial: int
    experiment: str
    seed: int
    config: JsonObject                    # the full server config the run trains with
    client: str                           # path of the client.py it runs
    target_step: int                      # the run ends once the server reaches this step
    episodes: int                         # episodes per client start
    group_size: int
    eval_every: int | None = None         # held-out cadence in steps (None: the client's own EVAL_EVERY)
    eval_samples: int | None = None       # each held-out task's episodes a round (None: the client's EVAL_SAMPLES)
    threads: int = 1                      # torch threads of its server (for the cost column)
    concurrency: int = 32                 # episodes in flight: one training batch (more would go stale)
    external: bool = False                # an existing server given by URL (never stopped by us)
    url: str = ""
    state_dir: str = ""                   # our server's state dir (its token files); "" for external servers
    port: int = 0
    server_pid: int | None = None
    server_started: float | None = None
    client_pid: int | None = None
    client_started: float | None = None
    base_step: int = 0                    # external servers: step when the run began
    launches: int = 0                     # server launches; > 1 would mean a run launched twice
    resumes: int = 0                      # server restarts from the run's checkpoint (after a park or a revive)
    revives: int = 0                      # of those, restarts after the server's process died (launcher.revive)
    revived_at_step: int = -1             # last_step when it was last revived
    client_starts: int = 0                # client processes started: the first, top-ups and restarts
    client_restarts: int = 0              # of those, restarts after a client failed (a top-up is not one)
    client_failures_in_a_row: int = 0     # client failures with no training step between them
    client_failed_at_step: int = -1       # last_step at the latest client failure
    client_log_offset: int = 0            # client.log's size when the current client started
    status: RunStatus = RunStatus.PENDING  # moved only by run_status.move (its table of allowed moves)
    reason: str = ""
    ending: RunStatus | None = None       # the end status decided before stopping the processes
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    last_step: int = 0
    last_progress_at: float = Field(default_factory=time.time)
    logged_step: int = 0                  # metrics with step <= this are in MLflow already
    mlflow_run_id: str | None = None
    server_logs_mlflow: bool = False      # our server writes the run's metrics itself (else the monitor copies them)
    parked_at: float | None = None
    parked_s: float = 0.0                 # time spent parked (excluded from the run's wall time)
    resumed_at: float | None = None
    finished_seen: int = 0                # server's finished-episode count at the last poll (stuck-client watchdog)
    finished_seen_at: float = Field(default_factory=time.time)
    # Where the run is placed (``researcher.runs.resources``, ``researcher.runs.ray_launcher``).
    placement: str = "local"              # local | ray
    node: str = ""                        # the host (local) or Ray node id its server runs on
    resources: dict[str, float] = Field(default_factory=dict)  # what it asks for: {"CPU": 1, "GPU": 1, ...}
    devices: list[str] = Field(default_factory=list)  # local GPUs it was given (its CUDA_VISIBLE_DEVICES)
    queued_at: float | None = None        # waiting for resources since (None: not waiting)
    queued_s: float = 0.0                 # time spent waiting for resources, over all its starts
    jobs: list[str] = Field(default_factory=list)  # Ray job submission ids of its server and clients, in order

    @model_validator(mode="before")
    @classmethod
    def _no_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            data = {k: v for k, v in data.items() if k != "token"}  # run.json of an older researcher
        return data

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def wall_s(self) -> float | None:
        if self.ended_at is None:
            return None
        return max(self.ended_at - self.started_at - self.parked_s, 0.0)


def path(run_dir: Path) -> Path:
    return run_dir / RUN_FILE


def load(run_dir: Path) -> RunRecord | None:
    file = path(run_dir)
    if not file.is_file():
        return None
    raw = json.loads(file.read_text())
    record = RunRecord.model_validate(raw)
    if not record.external and not record.state_dir and record.launches:
        record.state_dir = str(run_dir / "server")  # launched before run.json named it
    if isinstance(raw, dict) and raw.get("token") and record.state_dir and not record.external:
        _keep_token(Path(record.state_dir), str(raw["token"]))
    return record


def _keep_token(state_dir: Path, token: str) -> None:
    """An older run.json's control token (its server was started with it) goes where our servers
    keep theirs, unless a token file is there already."""
    try:
        fd = os.open(private_dir(state_dir) / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(token)


def private_dir(folder: Path) -> Path:
    """``folder`` created if needed and made 0700 (run dirs and server state dirs hold credentials and logs)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def save(run_dir: Path, record: RunRecord) -> None:
    private_dir(run_dir)
    write_atomic(path(run_dir), record.model_dump_json(indent=2))


def all_records(runs_dir: Path) -> list[RunRecord]:
    if not runs_dir.is_dir():
        return []
    records = [load(d) for d in sorted(runs_dir.iterdir()) if d.is_dir()]
    return [r for r in records if r is not None]


METRICS_FILE = "metrics.jsonl"


def append_metrics(run_dir: Path, steps: list[Any]) -> None:
    """Keep the run's per-step metrics beside run.json, so analysis never needs the server alive."""
    if not steps:
        return
    with open(run_dir / METRICS_FILE, "ab") as out:
        start = out.tell()
        try:
            out.write("".join(item.model_dump_json() + "\n" for item in steps).encode())
            out.flush()
        except OSError:  # a full disk: whole lines or none (the monitor logs these steps again next poll)
            out.truncate(start)
            raise


def read_curve(run_dir: Path, metric: str, horizon: int | None = None) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; a step logged twice (a crash between writes) counts once."""
    file = run_dir / METRICS_FILE
    if not file.is_file():
        return [], []
    by_step: dict[int, float] = {}
    for line in file.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:  # blank, or cut short by a crash
            continue
        value = item.get("metrics", {}).get(metric)
        if value is not None and (horizon is None or item["step"] <= horizon):
            by_step[int(item["step"])] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def read_steps(run_dir: Path, after: int = 0) -> list[Any]:
    """The run's per-step metrics after step ``after`` as ``StepMetrics``, in step order. A step with
    several lines (its held-out round logged after it, a crash between writes, a step retrained after
    a restart) is one: its metrics merged, the later line's value winning per key."""
    from swarm.protocol import StepMetrics

    file = run_dir / METRICS_FILE
    if not file.is_file():
        return []
    by_step: dict[int, Any] = {}
    for line in file.read_text().splitlines():
        try:
            item = StepMetrics.model_validate_json(line)
        except ValueError:  # blank, or cut short by a crash
            continue
        if item.step > after:
            earlier = by_step.get(item.step)
            if earlier is not None:
                item = item.model_copy(update={"metrics": {**earlier.metrics, **item.metrics}})
            by_step[item.step] = item
    return [by_step[s] for s in sorted(by_step)]
