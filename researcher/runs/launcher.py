"""Start, re-attach to and stop training runs: a `swarm serve` process plus a `swarm run` client.

Every run gets its own run dir ``artifacts/<study>/runs/<iteration>-<trial>/`` (mode 0700), a free
loopback port, log files, and a run.json written *before* the server is spawned (so a crash between
spawn and record cannot lead to a second launch: the recorded port is probed and a live server
adopted). Servers may also be existing ones given by URL (``external``): those are patched with the
run's config and never stopped by us.

Credentials (tokens read from the server's state dir, never on a command line) and the processes'
commands and environment are ``researcher.runs.processes``'s; the smoke run is ``researcher.runs.smoke``'s.

The launcher is the one writer of run.json: the nodes change a run only through its methods
(register, start, note progress, stop, park, unpark, end), and read a run's logs through it too.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from researcher.runs import detached, resources, sandbox, smoke
from researcher.runs import record as runs
from researcher.runs import status as run_status
from researcher.runs.logs import CLIENT_LOG, SERVER_LOG, SUMMARY, cap, log_size, tail
from researcher.runs.processes import STATE_DIR, LaunchError, RunProcesses
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus
from swarm import ports
from swarm.client import SwarmError

log = logging.getLogger(__name__)
MAX_REVIVES = 3  # server restarts after its process died, before one must have trained a step to earn another


class Launcher(RunProcesses):
    """Local placement: runs are processes on this machine; GPUs (if any) are partitioned per run.

    The Ray launcher (``researcher.runs.ray_launcher``) keeps this interface and places the processes on a
    cluster instead; the nodes never ask which one they have."""

    placement = "local"

    # ------------------------------------------------------------------ records

    def register(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Write a new run's record before anything is launched (the idempotency anchor)."""
        runs.save(run_dir, record)
        return record

    def note_progress(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Save what a poll learned about a live run (steps, logged metrics, finished episodes), and
        keep its logs under their size cap (a client's offset moves back with what was cut)."""
        cap(run_dir / SERVER_LOG, self.log_max_bytes, self.log_keep)
        cut = cap(run_dir / CLIENT_LOG, self.log_max_bytes, self.log_keep)
        record.client_log_offset = max(0, record.client_log_offset - cut)
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
        return record.external or detached.alive(record.server_pid, record.server_started)

    def client_alive(self, record: RunRecord) -> bool:
        return detached.alive(record.client_pid, record.client_started)

    def awaiting_client(self, record: RunRecord) -> bool:
        """The run's server was (re)started and its client is not yet: the monitor starts it once the server answers."""
        return record.client_pid is None

    def stop_client(self, record: RunRecord) -> None:
        detached.stop_group(record.client_pid, record.client_started, grace_s=3.0)

    def revive(self, run_dir: Path, record: RunRecord) -> bool:
        """Restart a run whose server died (SIGKILLed, OOM-killed) on its state dir, from its last
        checkpoint, on a fresh port; the monitor starts its client once it answers. True if it did.

        Bounded: after ``MAX_REVIVES`` restarts, a server that trained no step since its last restart is
        not restarted again (one that dies as it starts is a crash, not bad luck)."""
        if record.external or record.ending is not None:
            return False
        if record.revives >= MAX_REVIVES and record.last_step <= record.revived_at_step:
            return False
        self.stop_client(record)
        record.client_pid = record.client_started = None
        record.port = ports.free_port()
        record.url = f"http://127.0.0.1:{record.port}"
        record.revives += 1
        record.resumes += 1
        record.revived_at_step = record.last_step
        record.resumed_at = record.last_progress_at = record.finished_seen_at = time.time()
        runs.save(run_dir, record)  # before spawning (see start_server)
        record.server_pid, record.server_started = self._spawn_server(run_dir, Path(record.client).parent / "config.toml",
                                                                      record)
        runs.save(run_dir, record)
        return True

    # ------------------------------------------------------------------ logs

    def server_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / SERVER_LOG, lines)

    def client_log(self, run_dir: Path, lines: int = 15) -> str:
        return tail(run_dir / CLIENT_LOG, lines)

    def log_files(self, run_dir: Path) -> list[Path]:
        """The files that document a run: its record and both processes' logs."""
        return [runs.path(run_dir), run_dir / SERVER_LOG, run_dir / CLIENT_LOG]

    # ------------------------------------------------------------------ servers

    def start_server(self, run_dir: Path, record: RunRecord, config_path: Path) -> RunRecord:
        """Spawn (or adopt) the run's server; idempotent on run.json."""
        if record.external:
            with self.client_for(record) as client:
                record.base_step = client.status().step
                record.target_step += record.base_step
                try:
                    client.patch_config(**{**record.config, "max_steps": record.target_step})
                except SwarmError as exc:  # a config it cannot take live (a key fixed at its start): the run fails
                    raise LaunchError(f"the server at {record.url} refused the run's config: {exc}") from exc
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
        record.port = ports.free_port()
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

    # ------------------------------------------------------------------ clients

    def start_client(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """Start the run's study client boxed: clean environment with the client token, resource
        limits, its own process group (what a previous client left in its group is stopped first)."""
        detached.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        argv = self.client_argv(record)
        env = sandbox.study_env(run_dir, client_token=self.client_token(record), threads=self.threads)
        limits = sandbox.Limits.for_episodes(record.episodes)
        record.client_log_offset = log_size(run_dir / CLIENT_LOG)
        pid, started = detached.spawn(argv, log_path=run_dir / CLIENT_LOG, env=env, cwd=run_dir, preexec=limits.apply)
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
        return SUMMARY.search(output) is not None

    # ------------------------------------------------------------------ stopping

    def stop(self, run_dir: Path, record: RunRecord, status: str, reason: str = "") -> RunRecord:
        """End a run: stop the client, ask the server to stop (checkpoint), then make sure it exits.

        The decision is saved first (``ending``): a researcher killed mid-stop finds it on resume and
        completes the same ending, instead of judging the server it stopped itself as crashed."""
        record.ending, record.reason = run_status.check(record.status, status), reason
        runs.save(run_dir, record)
        detached.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        if not record.external and detached.alive(record.server_pid, record.server_started):
            try:
                with self.client_for(record, timeout=15.0) as client:
                    client.control("stop")
            except SwarmError as exc:
                log.info("control stop of %s failed (%s); terminating it", record.key, exc)
            if not detached.wait_exit(record.server_pid, record.server_started, 20.0):
                detached.stop_group(record.server_pid, record.server_started)
        self.shed_ended(record)
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
        detached.stop_group(record.client_pid, record.client_started, grace_s=3.0)
        server_alive = record.external or detached.alive(record.server_pid, record.server_started)
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
            if not record.external and not (asked_stop and detached.wait_exit(record.server_pid, record.server_started,
                                                                           30.0)):
                detached.stop_group(record.server_pid, record.server_started)
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
            record.port = ports.free_port()
            record.url = f"http://127.0.0.1:{record.port}"
            runs.save(run_dir, record)  # before spawning (see start_server)
            record.server_pid, record.server_started = self._spawn_server(run_dir, config_path, record)
        record.resumes += 1
        runs.save(run_dir, record)
        return record

    # ------------------------------------------------------------------ smoke runs

    def smoke(self, client_path: Path, config_path: Path, work_dir: Path, *, episodes: int, group_size: int,
              timeout_s: float, server_url: str | None = None, rewards_out: Path | None = None) -> str | None:
        """A smoke run of a client (``researcher.runs.smoke.run``): None if it worked, else the error."""
        return smoke.run(self, client_path, config_path, work_dir, episodes=episodes, group_size=group_size,
                         timeout_s=timeout_s, server_url=server_url, rewards_out=rewards_out)
