"""Start, re-attach to and stop training runs: a `swarm serve` process plus a `swarm run` client.

Every run gets its own state dir under ``artifacts/<study>/runs/<iteration>-<trial>/``, a free
loopback port, a control token we generate, log files, and a run.json written *before* the server
is spawned (so a crash between spawn and record cannot lead to a second launch: the recorded port
is probed and a live server adopted). Servers may also be existing ones given by URL
(``external``): those are patched with the run's config and never stopped by us.

The launcher is the one writer of run.json: the nodes change a run only through its methods
(register, start, note progress, stop, park, unpark, end), and read a run's logs through it too.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from swarm.client import SwarmClient, SwarmError

from researcher import procs, runs
from researcher.runs import RunRecord

log = logging.getLogger(__name__)

SERVER_LOG = "server.log"
_SUMMARY = re.compile(r"finished=(\d+) aborted=(\d+)")
CLIENT_LOG = "client.log"


class LaunchError(RuntimeError):
    """A server did not come up (its log tail is in the message)."""


class Launcher:
    def __init__(self, swarm_command: Sequence[str], *, model: str = "tiny", threads: int = 1,
                 ready_timeout_s: float = 120.0, external_token: str | None = None) -> None:
        self.swarm_command = list(swarm_command)
        self.model = model
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
        record.status, record.reason = "crashed", error[-500:]
        runs.save(run_dir, record)
        return record

    def end_parked(self, run_dir: Path, record: RunRecord, status: str, reason: str) -> RunRecord:
        """End a parked run without restarting it (it has no processes); parked time is not run time."""
        record.status, record.reason, record.ended_at = status, reason, time.time()
        if record.parked_at:
            record.parked_s += record.ended_at - record.parked_at
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ logs

    def server_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / SERVER_LOG, lines)

    def client_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / CLIENT_LOG, lines)

    def log_files(self, run_dir: Path) -> list[Path]:
        """The files that document a run: its record and both processes' logs."""
        return [runs.path(run_dir), run_dir / SERVER_LOG, run_dir / CLIENT_LOG]

    # ------------------------------------------------------------------ servers

    def _env(self) -> dict[str, str]:
        # The researcher is the one MLflow writer of a run; the server must not open its own.
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def _spawn_server(self, run_dir: Path, config: Path, seed: int, port: int, token: str) -> tuple[int, float | None]:
        argv = self.swarm_command + ["serve", "--model", self.model, "--host", "127.0.0.1", "--port", str(port),
                                     "--state-dir", str(run_dir / "server"), "--config", str(config),
                                     "--seed", str(seed), "--token", token, "--threads", str(self.threads)]
        return procs.spawn(argv, log_path=run_dir / SERVER_LOG, env=self._env(), cwd=run_dir)

    def client_for(self, record: RunRecord, timeout: float = 10.0) -> SwarmClient:
        return SwarmClient(record.url, token=record.token or None, timeout=timeout, retry_for_s=0)

    def start_server(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        """Spawn (or adopt) the run's server; idempotent on run.json."""
        if record.external:
            with self.client_for(record) as client:
                client.patch_config(**record.config)
                record.base_step = client.status().step
            record.target_step += record.base_step
            record.launches += 1
            record.status = "running"
            runs.save(run_dir, record)
            return record
        if record.server_pid is None and record.port:
            # A crash between spawn and record: adopt a server already answering on the recorded port.
            with self.client_for(record, timeout=2.0) as client:
                if client.health():
                    log.warning("adopting a live server for %s on port %s", record.key, record.port)
                    record.status = "running"
                    runs.save(run_dir, record)
                    return record
        record.port = procs.free_port()
        record.url = f"http://127.0.0.1:{record.port}"
        record.token = record.token or secrets.token_urlsafe(24)
        record.status, record.started_at = "running", time.time()
        runs.save(run_dir, record)  # before spawning: the record must exist if we die right after
        pid, started = self._spawn_server(run_dir, config_path, record.seed, record.port, record.token)
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
        argv = self.swarm_command + ["run", record.client, "--server", record.url, "--episodes", str(record.episodes),
                                     "--group-size", str(record.group_size), "--seed", str(record.seed),
                                     "--concurrency", str(record.concurrency), "--retry-for", "30"]
        if record.token:
            argv += ["--token", record.token]
        pid, started = procs.spawn(argv, log_path=run_dir / CLIENT_LOG, env=self._env(), cwd=run_dir)
        record.client_pid, record.client_started = pid, started
        record.client_starts += 1
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ stopping

    def stop(self, run_dir: Path, record: RunRecord, status: str, reason: str = "") -> RunRecord:
        """End a run: stop the client, ask the server to stop (checkpoint), then make sure it exits.

        The decision is saved first (``ending``): a researcher killed mid-stop finds it on resume and
        completes the same ending, instead of judging the server it stopped itself as crashed."""
        record.ending, record.reason = status, reason
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
        record.status, record.ending, record.ended_at = status, None, time.time()
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
        record.status, record.reason, record.parked_at = "parked", reason, time.time()
        record.client_pid = record.client_started = None
        if not record.external:
            record.server_pid = record.server_started = None
        runs.save(run_dir, record)
        return record

    def unpark(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        """Restart a parked run: its server resumes from the checkpoint in its state dir; the monitor
        starts the client once the server answers."""
        now = time.time()
        record.parked_s += now - (record.parked_at or now)
        record.parked_at, record.resumed_at = None, now
        record.status, record.reason, record.last_progress_at = "running", "", now
        record.finished_seen, record.finished_seen_at = 0, now
        if not record.external:
            record.port = procs.free_port()
            record.url = f"http://127.0.0.1:{record.port}"
            runs.save(run_dir, record)  # before spawning (see start_server)
            record.server_pid, record.server_started = self._spawn_server(run_dir, config_path, record.seed,
                                                                          record.port, record.token)
        record.resumes += 1
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ smoke runs

    def smoke(self, client_path: Path, config_path: Path, work_dir: Path, *, episodes: int, group_size: int,
              timeout_s: float, server_url: str | None = None) -> str | None:
        """Run ``episodes`` episodes of a client against a fresh server; None if it worked, else the error."""
        work_dir.mkdir(parents=True, exist_ok=True)
        record = RunRecord(key="smoke", study_id="smoke", iteration=0, trial=0, experiment="smoke", seed=0,
                           config={}, client=str(client_path), target_step=0, episodes=episodes,
                           group_size=group_size, external=server_url is not None, url=server_url or "",
                           token=(self.external_token or "") if server_url else "")
        try:
            if server_url is None:
                record.port = procs.free_port()
                record.url = f"http://127.0.0.1:{record.port}"
                record.token = secrets.token_urlsafe(24)
                record.server_pid, record.server_started = self._spawn_server(work_dir, config_path, 0, record.port,
                                                                              record.token)
            try:
                self.wait_ready(work_dir, record)
            except LaunchError as exc:
                return str(exc)
            argv = self.swarm_command + ["run", str(client_path), "--server", record.url, "--episodes", str(episodes),
                                         "--group-size", str(group_size), "--concurrency", str(group_size),
                                         "--retry-for", "10"]
            if record.token:
                argv += ["--token", record.token]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self._env(),
                                      cwd=work_dir)
            except subprocess.TimeoutExpired:
                return f"the smoke run of {episodes} episodes did not finish within {timeout_s:.0f} s"
            (work_dir / CLIENT_LOG).write_text(done.stdout + done.stderr)
            output = done.stdout + done.stderr
            if done.returncode != 0:
                return f"`swarm run` exited with code {done.returncode}:\n{output[-6000:]}"
            counts = _SUMMARY.search(output)
            if counts is None:
                return f"`swarm run` printed no summary line:\n{output[-6000:]}"
            finished, aborted = int(counts.group(1)), int(counts.group(2))
            if aborted or not finished:
                # The runner logs the first aborted episode's traceback: that is what repair needs.
                return f"{aborted} of {finished + aborted} smoke episodes aborted:\n{output[-6000:]}"
            return None
        finally:
            if server_url is None:
                procs.stop_group(record.server_pid, record.server_started, grace_s=5.0)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
