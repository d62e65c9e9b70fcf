"""Ray placement: each run's server and client are Ray Jobs on a cluster (``--ray-address``).

Why Ray Jobs (``JobSubmissionClient``) rather than actors:
- a job outlives the process that submitted it, so a SIGKILLed researcher leaves its runs training
  and its resume re-attaches to them by submission id, as it does to local processes by pid;
- the submission id is unique per cluster, so a resubmission after a crash between "submit" and
  "record" is refused by Ray instead of starting a run twice (we adopt the job that exists);
- the server stays the same ``swarm serve`` process (with its vLLM child or verl workers, which
  join the same cluster), with its resource request (``entrypoint_num_cpus/gpus/resources``); Ray
  queues a job until a node has what it asks for (GPU requests are written, not run here: no GPU);
- logs come back through the Jobs API (``get_job_logs``) into the run dir;
- an actor would tie the server's lifetime to a driver (ours), or need a detached actor plus our
  own log shipping and process supervision inside it.

Job ids: ``<study>-<iteration>-<trial>-server-<n>`` (n = server starts: first launch, resumes) and
``…-client-<n>``; all are kept in run.json (``jobs``). The server reports its address through the
run dir (``researcher.runs.ray_entry``), which every node shares; the control and client tokens stay in
the server's state dir (0600) on that shared path — never on a command line, in a job's entrypoint,
metadata or runtime env. A run whose server job fails (its node died) is resubmitted and resumes
from its last checkpoint in the shared state dir (``resumes`` counted), up to ``MAX_REVIVES``.

Only this module (and the cluster-side ``researcher.runs.ray_entry``) imports ray, lazily.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from researcher.runs import ray_address, resources
from researcher.runs import record as runs
from researcher.runs import status as run_status
from researcher.runs.launcher import Launcher
from researcher.runs.logs import CLIENT_LOG, log_size
from researcher.runs.processes import STATE_DIR
from researcher.runs.ray_entry import ADDRESS_FILE
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus
from swarm.client import SwarmClient, SwarmError

log = logging.getLogger(__name__)
MAX_REVIVES = 3
RAY_LOG = "ray-jobs.log"
_LIVE = ("PENDING", "RUNNING")
_NOWHERE = "http://127.0.0.1:9"  # a run whose server has not reported its address yet: polls fail fast
_LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "vfat", "ramfs"}


class ClusterNotShared(ValueError):
    """A cluster study whose artifacts dir or MLflow store only this machine can see."""


class RayLauncher(Launcher):
    placement = "ray"

    def __init__(self, address: str, swarm_command: Sequence[str], *, model: str | None = None, threads: int = 1,
                 ready_timeout_s: float = 300.0, mlflow_uri: str | None = None,
                 artifacts_root: Path | None = None, python: str = sys.executable,
                 box_read: Sequence[Path] = (), keep_training_state: bool = False) -> None:
        super().__init__(swarm_command, model=model, threads=threads, ready_timeout_s=ready_timeout_s,
                         mlflow_uri=mlflow_uri, artifacts_root=artifacts_root, box_read=box_read,
                         keep_training_state=keep_training_state)
        self.address = address
        self.python = python
        self._client: Any = None

    @property
    def jobs(self) -> Any:
        """The cluster's Jobs API client, built on first use from the dashboard URL ``--ray-address``
        resolves to (``ray_address``: a GCS ``HOST:PORT`` too; ``ValueError``/``ConnectionError``)."""
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            url = ray_address.dashboard_url(self.address)
            with ray_address.explicit(url):
                self._client = JobSubmissionClient(url)
        return self._client

    # ------------------------------------------------------------------ the cluster

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes: {node_id, node_ip, resources}."""
        from ray.util.state import list_nodes

        url = self.jobs.get_address()
        with ray_address.explicit(url):
            found = list_nodes(address=url, filters=[("state", "=", "ALIVE")], detail=True)
        return [{"node_id": n.node_id, "node_ip": n.node_ip, "resources": dict(n.resources_total or {})}
                for n in found]

    def check_shared(self, artifacts_root: Path, mlflow_uri: str) -> None:
        """Refuse a study whose artifacts or MLflow store other nodes cannot reach (unless every node of
        the cluster is this machine)."""
        ips = {n["node_ip"] for n in self.nodes()}
        if all(_is_this_machine(ip) for ip in ips):
            return
        problems = []
        fs = _fs_type(artifacts_root)
        if fs in _LOCAL_FS:
            problems.append(f"the artifacts dir {artifacts_root} is on a local {fs} file system: give "
                            "--artifacts-dir a path every node mounts (NFS, Lustre, CephFS, …)")
        if mlflow_uri.startswith(("sqlite:", "file:")) or "://" not in mlflow_uri:
            problems.append(f"MLflow at {mlflow_uri} is a file on this machine: set MLFLOW_TRACKING_URI to an "
                            "http:// tracking server every node can reach (`mlflow server --host 0.0.0.0`)")
        if problems:
            raise ClusterNotShared(f"the Ray cluster at {self.address} has nodes other than this machine "
                                   f"({', '.join(sorted(ips))}), and " + "; ".join(problems))

    def never_fits(self, request: resources.Request) -> str | None:
        return None  # a cluster may grow (autoscaler); Ray keeps the job pending until it fits

    def reserve(self, run_dir: Path, record: RunRecord) -> bool:
        """Ray is the queue: the job waits PENDING until a node has what the run asks for."""
        record.placement = "ray"
        return True

    # ------------------------------------------------------------------ submitting

    def _sid(self, record: RunRecord, kind: str, n: int) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "-", f"{record.key}-{kind}-{n}")

    def _submit(self, run_dir: Path, record: RunRecord, sid: str, entry: list[str], argv: list[str],
                request: dict[str, float]) -> None:
        """Submit one job (idempotent on ``sid``: a job that exists is adopted, never submitted again)."""
        env = {"OMP_NUM_THREADS": str(self.threads), "RESEARCHER_SUBMISSION_ID": sid, "PYTHONUNBUFFERED": "1"}
        if self.mlflow_uri and "@" not in self.mlflow_uri and record.server_logs_mlflow and "-server-" in sid:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_uri  # credentials never go into a job's runtime env
        entrypoint = shlex.join([self.python, "-m", "researcher.runs.ray_entry", *entry, "--", *argv])
        custom = {k: v for k, v in request.items() if k not in (resources.CPU, resources.GPU)}
        try:
            self.jobs.submit_job(entrypoint=entrypoint, submission_id=sid, runtime_env={"env_vars": env},
                                 entrypoint_num_cpus=request.get(resources.CPU, 0) or None,
                                 entrypoint_num_gpus=request.get(resources.GPU, 0) or None,
                                 entrypoint_resources=custom or None,
                                 metadata={"researcher.run_key": record.key, "researcher.kind": sid.rsplit("-", 2)[-2]})
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise
            log.warning("job %s exists already (a crash after submitting): adopting it", sid)

    def _submit_server(self, run_dir: Path, config: Path, record: RunRecord) -> None:
        argv = self.serve_argv(run_dir, config, record)
        run_id = record.mlflow_run_id
        record.server_logs_mlflow = bool(self.mlflow_uri and "@" not in self.mlflow_uri and run_id
                                         and not run_id.startswith("local-"))
        if record.server_logs_mlflow:
            argv += ["--mlflow-run-id", str(run_id)]
        sid = self._sid(record, "server", record.launches + record.resumes)
        if sid not in record.jobs:  # else: recorded before a crash, perhaps submitted: adopt, keep its address
            (run_dir / ADDRESS_FILE).unlink(missing_ok=True)
            record.jobs.append(sid)
        record.url, record.node, record.queued_at = "", "", time.time()
        record.client_pid = record.client_started = record.server_pid = record.server_started = None
        runs.save(run_dir, record)  # the job id is on disk before the job exists
        self._submit(run_dir, record, sid, ["serve", str(run_dir)], argv, record.resources)

    def start_server(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        record.state_dir = str(run_dir / STATE_DIR)
        run_status.move(record, RunStatus.RUNNING)
        record.started_at = time.time()
        self._submit_server(run_dir, config_path, record)
        record.launches += 1
        record.last_progress_at = time.time()
        runs.save(run_dir, record)
        return record

    def unpark(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        self._mark_unparked(record)
        self._submit_server(run_dir, config_path, record)
        record.resumes += 1
        runs.save(run_dir, record)
        return record

    def revive(self, run_dir: Path, record: RunRecord) -> bool:
        """A server job that FAILED (its node died, it was killed) is resubmitted from its checkpoint."""
        server = self._server_job(record)
        if server is None or self._status(server) != "FAILED" or record.resumes >= MAX_REVIVES:
            return False
        self.stop_client(record)
        self._stop_orphan(record)
        self._fetch_logs(run_dir, record)
        record.resumed_at = record.last_progress_at = record.finished_seen_at = time.time()
        self._submit_server(run_dir, Path(record.client).parent / "config.toml", record)
        record.resumes += 1
        runs.save(run_dir, record)
        return True

    def _stop_orphan(self, record: RunRecord) -> None:
        """A server whose job failed may still run (a raylet killed, its children left behind): it must
        not write the state dir beside its successor. Asked to stop if it still answers."""
        if not record.url:
            return
        try:
            with SwarmClient(record.url, token=self.control_token(record) or "", timeout=5.0, retry_for_s=0) as old:
                if old.health():
                    old.control("stop")
                    _wait(lambda: not old.health(), 30.0)
        except SwarmError:
            pass

    # ------------------------------------------------------------------ state of the jobs

    def _status(self, sid: str | None) -> str | None:
        if not sid:
            return None
        try:
            return str(self.jobs.get_job_status(sid).value)
        except RuntimeError:  # not found
            return None

    def _server_job(self, record: RunRecord) -> str | None:
        return next((j for j in reversed(record.jobs) if "-server-" in j), None)

    def _client_job(self, record: RunRecord) -> str | None:
        last = record.jobs[-1] if record.jobs else ""
        return last if "-client-" in last else None

    def _resolve(self, record: RunRecord) -> None:
        """Learn where the run's server listens (its address file) and on which node it runs."""
        server = self._server_job(record)
        if server is None or (record.url and record.node):
            return
        try:
            found = json.loads((Path(record.state_dir).parent / ADDRESS_FILE).read_text())
        except (OSError, ValueError):
            return
        if found.get("submission_id") != server:
            return
        record.url = f"http://{found['host']}:{found['port']}"
        if record.queued_at is not None:  # Ray started the job: the server's ready timeout counts from now
            record.queued_s += time.time() - record.queued_at
            record.queued_at = None
            record.resumed_at = time.time()
        try:
            record.node = self.jobs.get_job_info(server).driver_node_id or found["host"]
        except RuntimeError:
            record.node = found["host"]

    def server_alive(self, record: RunRecord) -> bool:
        return self._status(self._server_job(record)) in _LIVE

    def client_alive(self, record: RunRecord) -> bool:
        return self._status(self._client_job(record)) in _LIVE

    def awaiting_client(self, record: RunRecord) -> bool:
        return self._client_job(record) is None

    def client_for(self, record: RunRecord, timeout: float = 10.0) -> SwarmClient:
        self._resolve(record)
        return SwarmClient(record.url or _NOWHERE, token=self.control_token(record) or "", timeout=timeout,
                           retry_for_s=0)

    def start_client(self, run_dir: Path, record: RunRecord) -> RunRecord:
        self.stop_client(record)
        self._resolve(record)
        argv = self.client_argv(record)
        sid = self._sid(record, "client", record.client_starts)
        if sid not in record.jobs:
            record.jobs.append(sid)
        record.client_log_offset = log_size(run_dir / CLIENT_LOG)
        record.client_starts += 1
        runs.save(run_dir, record)
        self._submit(run_dir, record, sid, ["client", str(run_dir), str(self.threads), str(record.episodes),
                                            record.state_dir], argv, {})
        return record

    def stop_client(self, record: RunRecord) -> None:
        client = self._client_job(record)
        if client and self._status(client) in _LIVE:
            self.jobs.stop_job(client)
            _wait(lambda: self._status(client) not in _LIVE, 15.0)

    def _stop_server(self, record: RunRecord, checkpoint_first: bool) -> None:
        server = self._server_job(record)
        status = self._status(server)
        if server is None or status not in _LIVE:
            return
        if status == "PENDING":  # never started: nothing to checkpoint
            self.jobs.stop_job(server)
            _wait(lambda: self._status(server) not in _LIVE, 15.0)
            return
        try:
            with self.client_for(record, timeout=30.0) as client:
                if client.health():
                    if checkpoint_first:
                        client.control("checkpoint")
                    client.control("stop")
        except SwarmError as exc:
            log.info("control stop of %s failed (%s); stopping its job", record.key, exc)
        if not _wait(lambda: self._status(server) not in _LIVE, 30.0):
            self.jobs.stop_job(server)
            _wait(lambda: self._status(server) not in _LIVE, 15.0)

    def stop(self, run_dir: Path, record: RunRecord, status: str, reason: str = "") -> RunRecord:
        record.ending, record.reason = run_status.check(record.status, status), reason
        runs.save(run_dir, record)
        self.stop_client(record)
        self._stop_server(record, checkpoint_first=False)
        self._fetch_logs(run_dir, record)
        self.shed_ended(record)
        run_status.move(record, status)
        record.ending, record.ended_at = None, time.time()
        if record.queued_at is not None:
            record.queued_s += record.ended_at - record.queued_at
            record.queued_at = None
        runs.save(run_dir, record)
        return record

    def park(self, run_dir: Path, record: RunRecord, reason: str) -> RunRecord:
        self.stop_client(record)
        self._stop_server(record, checkpoint_first=True)
        self._fetch_logs(run_dir, record)
        run_status.move(record, RunStatus.PARKED, reason)
        record.parked_at = time.time()
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ logs

    def _fetch_logs(self, run_dir: Path, record: RunRecord) -> None:
        """The Ray logs of the run's jobs (where each ran, how it ended), fetched from the cluster into
        ``ray-jobs.log``; the processes' own output is in server.log and client.log (``ray_entry``)."""
        parts = []
        for sid in record.jobs:
            try:
                info = self.jobs.get_job_info(sid)
                parts.append(f"===== Ray job {sid}: {info.status} on node {info.driver_node_id} "
                             f"{info.message or ''}\n{self.jobs.get_job_logs(sid)}")
            except RuntimeError as exc:  # a dead node's job log may be gone with it
                parts.append(f"===== Ray job {sid}: no logs ({str(exc).splitlines()[0][:200]})")
        if parts:
            (run_dir / RAY_LOG).write_text("\n".join(parts))

    def log_files(self, run_dir: Path) -> list[Path]:
        record = runs.load(run_dir)
        if record is not None:
            self._fetch_logs(run_dir, record)
        return [*super().log_files(run_dir), run_dir / RAY_LOG]


def _wait(done: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.3)
    return bool(done())


def _is_this_machine(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine: only then can a socket bind it."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family) as sock:
            sock.bind((ip, 0))
        return True
    except OSError:
        return False


def _fs_type(path: Path) -> str:
    """The file system type ``path`` lives on (longest mount prefix in /proc/mounts)."""
    target = str(path.resolve())
    best, kind = "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")) \
                and len(fields[1]) >= len(best):
            best, kind = fields[1], fields[2]
    return kind


__all__ = ["ClusterNotShared", "RayLauncher"]
