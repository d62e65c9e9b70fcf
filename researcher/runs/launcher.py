"""Start, re-attach to and stop training runs: a `swarm serve` process plus a `swarm run` client.

Every run gets its own run dir ``artifacts/<study>/runs/<iteration>-<trial>/`` (mode 0700), a free
loopback port, log files, and a run.json written *before* the server is spawned (so a crash between
spawn and record cannot lead to a second launch: the recorded port is probed and a live server
adopted). Servers may also be existing ones given by URL (``external``): those are patched with the
run's config and never stopped by us.

Credentials: our servers bind loopback without a token, so `swarm serve` generates its control
token and client token and keeps them in its state dir (``<run dir>/server/token`` and
``client_token``, 0600), reusing them when it restarts on that dir (a park, a crash). The launcher
reads them from there when it needs them: the files are the one copy, they survive a researcher
restart, and no token is ever on a command line or in run.json. The server's environment is ours
minus tokens and the MLflow URI; study code (`swarm run`) runs boxed (``researcher.sandbox``) with
only the client token, by environment. External servers get the configured token the same way.

The launcher is the one writer of run.json: the nodes change a run only through its methods
(register, start, note progress, stop, park, unpark, end), and read a run's logs through it too.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from swarm.client import SwarmClient, SwarmError

from researcher import procs, sandbox
from researcher.runs import record as runs, resources, status as run_status
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus
from researcher.spool import LOCAL_PREFIX

log = logging.getLogger(__name__)

SERVER_LOG = "server.log"
_SUMMARY = re.compile(r"finished=(\d+) aborted=(\d+)")
_ABORTED = re.compile(r"(episode \S+ of task \S+ aborted: .*)")  # the runner's log line of an aborted episode
CLIENT_LOG = "client.log"
STATE_DIR = "server"  # the server's state dir inside the run dir
TOKEN_FILE, CLIENT_TOKEN_FILE = "token", "client_token"  # written there by `swarm serve`
# Never inherited by a server we start: it must make (or reuse) its own tokens, and the researcher
# is the one MLflow writer of a run.
_NOT_FOR_SERVERS = ("SWARM_TOKEN", sandbox.CLIENT_TOKEN_ENV, "MLFLOW_TRACKING_URI")


class LaunchError(RuntimeError):
    """A server did not come up (its log tail is in the message)."""


class Launcher:
    """Local placement: runs are processes on this machine; GPUs (if any) are partitioned per run.

    The Ray launcher (``researcher.runs.ray_launcher``) keeps this interface and places the processes on a
    cluster instead; the nodes never ask which one they have."""

    placement = "local"

    def __init__(self, swarm_command: Sequence[str], *, model: str | None = None, threads: int = 1,
                 ready_timeout_s: float = 120.0, external_token: str | None = None,
                 mlflow_uri: str | None = None, gpus: Sequence[str] = (), artifacts_root: Path | None = None) -> None:
        self.gpus = list(gpus)  # this machine's GPU ids runs may use (``resources.discover_gpus``)
        self.artifacts_root = artifacts_root  # where every study's run records are (who holds which GPU)
        self.swarm_command = list(swarm_command)
        self.mlflow_uri = mlflow_uri  # handed to our servers, so each run's metrics have one writer
        self.model = model  # None: the run's config.toml names the model (its `model` key), else swarm's default
        self.threads = threads
        self.ready_timeout_s = ready_timeout_s
        self.external_token = external_token

    # ------------------------------------------------------------------ records

    def register(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Write a new run's record before anything is launched (the idempotency anchor)."""
        runs.save(run_dir, record)
        return record

    def note_progress(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Save what a poll learned about a live run (steps, logged metrics, finished episodes)."""
        runs.save(run_dir, record)
        return record

    def fail_start(self, run_dir: Path, record: RunRecord, error: str) -> RunRecord:
        """A run whose server could not be started ends crashed with the error as its reason."""
        run_status.move(record, RunStatus.CRASHED, error[-500:])
        runs.save(run_dir, record)
        return record

    def end_parked(self, run_dir: Path, record: RunRecord, status: str, reason: str) -> RunRecord:
        """End a parked run without restarting it (it has no processes); parked time is not run time."""
        run_status.move(record, status, reason)
        record.ended_at = time.time()
        if record.parked_at:
            record.parked_s += record.ended_at - record.parked_at
        if record.queued_at is not None:  # it waited for resources and never got them
            record.queued_s += record.ended_at - record.queued_at
            record.queued_at = None
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ resources

    def never_fits(self, request: resources.Request) -> str | None:
        """Why a run asking ``request`` can never start here (None: it can, perhaps after waiting)."""
        return resources.never_fits(request, self.gpus)

    def reserve(self, run_dir: Path, record: RunRecord) -> bool:
        """Give the run the local devices it asks for, or mark it waiting (``queued_at``); True when it may
        start now. The choice and its record are made under a machine-wide lock, so two researchers on
        one machine never hand out the same device; it is saved in run.json, so it survives a restart."""
        from filelock import FileLock

        if record.external:
            record.placement, record.node = "external", record.url
            return True
        now = time.time()
        request = resources.Request(amounts=record.resources)
        lock_dir = self.artifacts_root or run_dir.parent
        lock_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock_dir / ".gpus.lock")):
            usage = resources.held(resources.live_records(self.artifacts_root) if self.artifacts_root
                                   else runs.all_records(run_dir.parent), but=record.key)
            devices = resources.assign(request, self.gpus, usage)
            if devices is None:
                if record.queued_at is None:
                    record.queued_at = now
                    runs.save(run_dir, record)
                return False
            record.devices, record.node, record.placement = devices, socket.gethostname(), self.placement
            if record.queued_at is not None:
                record.queued_s += now - record.queued_at
                record.queued_at = None
            runs.save(run_dir, record)
        return True

    def release(self, record: RunRecord) -> None:
        """A run that stops its processes (parked, ended) gives its devices back."""
        record.devices = []

    # ------------------------------------------------------------------ liveness

    def server_alive(self, record: RunRecord) -> bool:
        return record.external or procs.alive(record.server_pid, record.server_started)

    def client_alive(self, record: RunRecord) -> bool:
        return procs.alive(record.client_pid, record.client_started)

    def awaiting_client(self, record: RunRecord) -> bool:
        """The run's server was (re)started and its client is not yet: the monitor starts it once the server answers."""
        return record.client_pid is None

    def stop_client(self, record: RunRecord) -> None:
        procs.stop_group(record.client_pid, record.client_started, grace_s=3.0)

    def revive(self, run_dir: Path, record: RunRecord) -> bool:
        """Restart a run whose server died with its node (from its last checkpoint); True if it did.
        A local server that died is a crash: nothing else took it down."""
        return False

    # ------------------------------------------------------------------ logs

    def server_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / SERVER_LOG, lines)

    def client_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / CLIENT_LOG, lines)

    def log_files(self, run_dir: Path) -> list[Path]:
        """The files that document a run: its record and both processes' logs."""
        return [runs.path(run_dir), run_dir / SERVER_LOG, run_dir / CLIENT_LOG]

    # ------------------------------------------------------------------ servers

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_SERVERS}
        env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def _placed_env(self, record: RunRecord) -> dict[str, str]:
        env = self._server_env()
        if self.gpus and record.resources:
            # Its own devices only; "" hides every GPU from a run that asked for none.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(record.devices)
        return env

    def serve_argv(self, run_dir: Path, config: Path, record: RunRecord) -> list[str]:
        """The run's `swarm serve` command wherever it is placed (the placement adds where it listens):
        no step past the run's target (``--max-steps``: the steps in MLflow, run.json and the report
        are one number)."""
        state_dir = runs.private_dir(run_dir / STATE_DIR)
        # The user's `researcher start --model` beats the config's `model`; without it the config decides.
        model = ["--model", self.model] if self.model is not None else []
        argv = self.swarm_command + ["serve", *model, "--state-dir", str(state_dir), "--config", str(config),
                                     "--seed", str(record.seed), "--threads", str(self.threads)]
        if record.target_step:
            argv += ["--max-steps", str(record.target_step)]
        return argv

    def client_argv(self, record: RunRecord) -> list[str]:
        """The run's `swarm run` command wherever it is placed."""
        return self.swarm_command + ["run", record.client, "--server", record.url, "--episodes", str(record.episodes),
                                     "--group-size", str(record.group_size), "--seed", str(record.seed),
                                     "--concurrency", str(record.concurrency), "--retry-for", "30"]

    def _spawn_server(self, run_dir: Path, config: Path, record: RunRecord) -> tuple[int, float | None]:
        """Start the run's `swarm serve` on loopback. With a real MLflow run id the server is its run's one metrics
        writer (``--mlflow-run-id``; the URI goes by environment, it may hold credentials); a run whose
        MLflow id is still a spool placeholder (the store was down) has its metrics copied by the monitor."""
        argv = self.serve_argv(run_dir, config, record) + ["--host", "127.0.0.1", "--port", str(record.port)]
        env = self._placed_env(record)
        run_id = record.mlflow_run_id
        record.server_logs_mlflow = bool(self.mlflow_uri and run_id and not run_id.startswith(LOCAL_PREFIX))
        if record.server_logs_mlflow:
            env["MLFLOW_TRACKING_URI"] = str(self.mlflow_uri)
            argv += ["--mlflow-run-id", str(run_id)]
        return procs.spawn(argv, log_path=run_dir / SERVER_LOG, env=env, cwd=run_dir)

    def control_token(self, record: RunRecord) -> str | None:
        """The run's control token: the configured one for an external server, else the one our
        server keeps in its state dir (None until the server has written it)."""
        if record.external:
            return self.external_token
        return _read_token(Path(record.state_dir) / TOKEN_FILE) if record.state_dir else None

    def client_token(self, record: RunRecord) -> str | None:
        """What study code claims episodes with: our server's client token; an external server's
        configured token (the only one we know); the control token of a server that wrote no
        client token (an older swarm), with a warning."""
        if record.external:
            return self.external_token
        token = _read_token(Path(record.state_dir) / CLIENT_TOKEN_FILE) if record.state_dir else None
        if token is None:
            log.warning("the server of %s wrote no %s; its client gets the control token", record.key,
                        CLIENT_TOKEN_FILE)
            token = self.control_token(record)
        return token

    def client_for(self, record: RunRecord, timeout: float = 10.0) -> SwarmClient:
        # "" rather than None: never fall back to a SWARM_TOKEN meant for external servers.
        return SwarmClient(record.url, token=self.control_token(record) or "", timeout=timeout, retry_for_s=0)

    def start_server(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        """Spawn (or adopt) the run's server; idempotent on run.json."""
        if record.external:
            with self.client_for(record) as client:
                record.base_step = client.status().step
                record.target_step += record.base_step
                client.patch_config(**{**record.config, "max_steps": record.target_step})
            record.launches += 1
            run_status.move(record, RunStatus.RUNNING)
            runs.save(run_dir, record)
            return record
        if record.server_pid is None and record.port:
            # A crash between spawn and record: adopt a server already answering on the recorded port.
            with self.client_for(record, timeout=2.0) as client:
                if client.health():
                    log.warning("adopting a live server for %s on port %s", record.key, record.port)
                    run_status.move(record, RunStatus.RUNNING)
                    runs.save(run_dir, record)
                    return record
        record.port = procs.free_port()
        record.url = f"http://127.0.0.1:{record.port}"
        record.state_dir = str(run_dir / STATE_DIR)
        run_status.move(record, RunStatus.RUNNING)
        record.started_at = time.time()
        runs.save(run_dir, record)  # before spawning: the record must exist if we die right after
        pid, started = self._spawn_server(run_dir, config_path, record)
        record.server_pid, record.server_started = pid, started
        record.launches += 1
        record.last_progress_at = time.time()
        runs.save(run_dir, record)
        return record

    def wait_ready(self, run_dir: Path, record: RunRecord) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        with self.client_for(record, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if client.health():
                    return
                if not record.external and not procs.alive(record.server_pid, record.server_started):
                    break
                time.sleep(0.3)
        raise LaunchError(f"server of {record.key} did not become ready:\n{tail(run_dir / SERVER_LOG)}")

    # ------------------------------------------------------------------ clients

    def start_client(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Start the run's study client boxed: clean environment with the client token, resource
        limits, its own process group (what a previous client left in its group is stopped first)."""
        procs.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        argv = self.client_argv(record)
        env = sandbox.study_env(run_dir, client_token=self.client_token(record), threads=self.threads)
        limits = sandbox.Limits.for_episodes(record.episodes)
        record.client_log_offset = log_size(run_dir / CLIENT_LOG)
        pid, started = procs.spawn(argv, log_path=run_dir / CLIENT_LOG, env=env, cwd=run_dir, preexec=limits.apply)
        record.client_pid, record.client_started = pid, started
        record.client_starts += 1
        runs.save(run_dir, record)
        return record

    def client_used_up(self, run_dir: Path, record: RunRecord) -> bool:
        """Whether the run's last client exited having run all its episodes (`swarm run` printed its
        summary line): it needs a top-up, not a restart. Read from its log, so it holds across a
        researcher restart (the exit status is only known to the process that spawned it)."""
        try:
            with open(run_dir / CLIENT_LOG, "rb") as log_file:
                log_file.seek(record.client_log_offset)
                output = log_file.read().decode(errors="replace")
        except OSError:
            return False
        return _SUMMARY.search(output) is not None

    # ------------------------------------------------------------------ stopping

    def stop(self, run_dir: Path, record: RunRecord, status: str, reason: str = "") -> RunRecord:
        """End a run: stop the client, ask the server to stop (checkpoint), then make sure it exits.

        The decision is saved first (``ending``): a researcher killed mid-stop finds it on resume and
        completes the same ending, instead of judging the server it stopped itself as crashed."""
        record.ending, record.reason = run_status.check(record.status, status), reason
        runs.save(run_dir, record)
        procs.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        if not record.external and procs.alive(record.server_pid, record.server_started):
            try:
                with self.client_for(record, timeout=15.0) as client:
                    client.control("stop")
            except SwarmError as exc:
                log.info("control stop of %s failed (%s); terminating it", record.key, exc)
            if not procs.wait_exit(record.server_pid, record.server_started, 20.0):
                procs.stop_group(record.server_pid, record.server_started)
        run_status.move(record, status)
        record.ending, record.ended_at = None, time.time()
        runs.save(run_dir, record)
        return record

    def stop_all(self, runs_dir: Path, status: str, reason: str) -> int:
        """Stop every run under ``runs_dir`` that has not ended; returns how many."""
        stopped = 0
        for run_dir in sorted(d for d in runs_dir.iterdir() if d.is_dir()) if runs_dir.is_dir() else []:
            record = runs.load(run_dir)
            if record is not None and not record.ended:
                self.stop(run_dir, record, status, reason)
                stopped += 1
        return stopped

    # ------------------------------------------------------------------ windows

    def park(self, run_dir: Path, record: RunRecord, reason: str) -> RunRecord:
        """Checkpoint the run and stop its processes, leaving it resumable (status ``parked``)."""
        procs.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        server_alive = record.external or procs.alive(record.server_pid, record.server_started)
        asked_stop = False
        if server_alive:
            try:
                with self.client_for(record, timeout=30.0) as client:
                    # A server still loading has trained nothing since its last checkpoint: just end it.
                    if client.health():
                        client.control("checkpoint")
                        if not record.external:
                            client.control("stop")  # stop also checkpoints; the state dir keeps both
                            asked_stop = True
            except SwarmError as exc:
                log.warning("checkpointing %s before parking failed: %s", record.key, exc)
            if not record.external and not (asked_stop and procs.wait_exit(record.server_pid, record.server_started,
                                                                           30.0)):
                procs.stop_group(record.server_pid, record.server_started)
        run_status.move(record, RunStatus.PARKED, reason)
        record.parked_at = time.time()
        self.release(record)
        record.client_pid = record.client_started = None
        if not record.external:
            record.server_pid = record.server_started = None
        runs.save(run_dir, record)
        return record

    @staticmethod
    def _mark_unparked(record: RunRecord) -> None:
        """A parked run runs again: its parked time is counted and its progress clock restarts
        (both placements; only how the server restarts differs)."""
        now = time.time()
        record.parked_s += now - (record.parked_at or now)
        record.parked_at, record.resumed_at = None, now
        run_status.move(record, RunStatus.RUNNING, "")
        record.last_progress_at = now
        record.finished_seen, record.finished_seen_at = 0, now

    def unpark(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        """Restart a parked run: its server resumes from the checkpoint in its state dir; the monitor
        starts the client once the server answers."""
        self._mark_unparked(record)
        if not record.external:
            record.port = procs.free_port()
            record.url = f"http://127.0.0.1:{record.port}"
            runs.save(run_dir, record)  # before spawning (see start_server)
            record.server_pid, record.server_started = self._spawn_server(run_dir, config_path, record)
        record.resumes += 1
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ smoke runs

    def smoke(self, client_path: Path, config_path: Path, work_dir: Path, *, episodes: int, group_size: int,
              timeout_s: float, server_url: str | None = None, rewards_out: Path | None = None) -> str | None:
        """Run ``episodes`` episodes of a client against a fresh server; None if it worked, else the error
        (its first line the verdict, the client's log tail below).

        The client runs boxed like a training run's (``researcher.sandbox``); on timeout its whole
        process group is killed. Episodes are claimed a group at a time (concurrency = ``group_size``);
        with ``rewards_out`` every episode's reward is recorded there (``swarm run --rewards-out``), for
        the checks of ``researcher.preflight``."""
        runs.private_dir(work_dir)
        record = RunRecord(key="smoke", study_id="smoke", iteration=0, trial=0, experiment="smoke", seed=0,
                           config={}, client=str(client_path), target_step=0, episodes=episodes,
                           group_size=group_size, external=server_url is not None, url=server_url or "",
                           state_dir="" if server_url else str(work_dir / STATE_DIR))
        try:
            if server_url is None:
                record.port = procs.free_port()
                record.url = f"http://127.0.0.1:{record.port}"
                record.server_pid, record.server_started = self._spawn_server(work_dir, config_path, record)
            try:
                self.wait_ready(work_dir, record)
            except LaunchError as exc:
                return str(exc)
            argv = self.swarm_command + ["run", str(client_path), "--server", record.url, "--episodes", str(episodes),
                                         "--group-size", str(group_size), "--concurrency", str(group_size),
                                         "--retry-for", "10"]
            if rewards_out is not None:
                argv += ["--rewards-out", str(rewards_out)]
            env = sandbox.study_env(work_dir, client_token=self.client_token(record), threads=self.threads)
            done = sandbox.run_boxed(argv, env=env, cwd=work_dir, limits=sandbox.Limits.for_episodes(episodes),
                                     timeout_s=timeout_s)
            (work_dir / CLIENT_LOG).write_text(done.output)
            output = done.output
            if done.timed_out:
                return (f"the smoke run of {episodes} episodes did not finish within {timeout_s:.0f} s "
                        f"(its processes were killed):\n{output[-3000:]}")
            if done.returncode != 0:
                return f"`swarm run` {done.describe()}: {_last_line(output)}\n{output[-6000:]}"
            counts = _SUMMARY.search(output)
            if counts is None:
                return f"`swarm run` printed no summary line:\n{output[-6000:]}"
            finished, aborted = int(counts.group(1)), int(counts.group(2))
            if aborted or not finished:
                # The runner logs the first aborted episode's traceback: that is what repair needs.
                first = _ABORTED.search(output)
                why = f"; the first: {first.group(1).strip()}" if first else ""
                return f"{aborted} of {finished + aborted} smoke episodes aborted{why}\n{output[-6000:]}"
            return None
        finally:
            if server_url is None:
                procs.stop_group(record.server_pid, record.server_started, grace_s=5.0)


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no output)"


def log_size(path: Path) -> int:
    """A log's size in bytes (0 if it does not exist yet): where the next process's output starts."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
