"""The soak's processes: finding each kind that is alive now, SIGKILLing one, sampling memory, and
finding what was left behind.

Every process a soak starts carries its marker: its command line or working directory lies under
the soak's temp dir, or its environment holds ``SOAK_MARKER`` (the researcher's boxed clients keep
only an allow-list of variables, but they run in their run dir). That is how leftovers are found at
the end, whoever their parent is by then (init adopts orphans).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from researcher.runs import detached
from researcher.runs import record as runs

MARKER_ENV = "SOAK_MARKER"
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass(frozen=True)
class Target:
    """One process to kill: its kind, pid, start time (a reused pid is never killed) and whether the
    whole process group goes (the MLflow server: its uvicorn workers die with it, as on a crash)."""

    kind: str
    pid: int
    started: float | None
    group: bool = False
    what: str = ""


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def researchers(study_ids: set[str]) -> list[Target]:
    """``researcher start`` / ``resume`` processes of these studies (the soak's and the daemon's sessions)."""
    found = []
    for pid in _pids():
        argv = _cmdline(pid)
        if any(a.endswith("researcher.cli") or a.endswith("/researcher") for a in argv) \
                and ("start" in argv or "resume" in argv) and study_ids & set(argv) and detached.alive(pid):
            found.append(Target("researcher", pid, detached.start_time(pid), what=" ".join(argv[2:5])))
    return found


def run_processes(runs_dirs: list[Path]) -> tuple[list[Target], list[Target]]:
    """(clients, servers) alive now, from every running run's run.json."""
    clients, servers = [], []
    for runs_dir in runs_dirs:
        for record in runs.all_records(runs_dir):
            if record.status != "running" or record.external:
                continue
            if detached.alive(record.client_pid, record.client_started):
                clients.append(Target("client", record.client_pid, record.client_started,  # type: ignore[arg-type]
                                      what=record.key))
            if detached.alive(record.server_pid, record.server_started):
                servers.append(Target("server", record.server_pid, record.server_started,  # type: ignore[arg-type]
                                      what=record.key))
    return clients, servers


def of_popen(kind: str, proc: subprocess.Popen | None, group: bool = False) -> list[Target]:
    if proc is None or proc.poll() is not None:
        return []
    return [Target(kind, proc.pid, detached.start_time(proc.pid), group=group)]


def kill(target: Target) -> bool:
    """SIGKILL the target (its group when ``group``); False if it was gone (or its pid reused) already."""
    if not detached.alive(target.pid, target.started):
        return False
    with contextlib.suppress(ProcessLookupError):
        if target.group:
            os.killpg(os.getpgid(target.pid), signal.SIGKILL)
        else:
            os.kill(target.pid, signal.SIGKILL)
    return True


def rss_mb(pid: int, group: bool = False) -> float | None:
    """Resident memory of a process (with ``group``: of its whole process group), in MB."""
    members = [pid]
    if group:
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        members = [p for p in _pids() if _pgid(p) == pgid]
    total = 0.0
    for member in members:
        try:
            total += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * PAGE_MB
        except (OSError, IndexError, ValueError):
            continue
    return total or None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@dataclass
class MemoryLog:
    """RSS samples of each long-lived process (a group target: each member), keyed by kind, pid and
    start time, so a restarted process is a new series."""

    warmup_s: float = 60.0  # imports, caches, a server's workers spawning: not growth
    samples: dict[tuple[str, int, float | None], list[tuple[float, float]]] = field(default_factory=dict)

    def sample(self, targets: list[Target]) -> None:
        now = time.monotonic()
        for target in targets:
            members = [target.pid]
            if target.group:
                pgid = _pgid(target.pid)
                members = [p for p in _pids() if pgid is not None and _pgid(p) == pgid]
            for pid in members:
                value = rss_mb(pid)
                if value is not None:
                    self.samples.setdefault((target.kind, pid, detached.start_time(pid)), []).append((now, value))

    def growth_mb(self, min_span_s: float = 60.0) -> float:
        """The largest growth of one process after its warm-up (its first ``warmup_s`` seen): the mean of
        its last quarter of samples minus that of its first quarter. Processes with less than
        ``min_span_s`` of samples after their warm-up are not judged."""
        return self.worst(min_span_s)[0]

    def worst(self, min_span_s: float = 60.0) -> tuple[float, str]:
        """``growth_mb`` and which process grew that much (kind, pid, seconds sampled after warm-up)."""
        worst, who = 0.0, "none"
        for (kind, pid, _started), series in self.samples.items():
            settled = [(t, v) for t, v in series if t - series[0][0] >= self.warmup_s]
            if len(settled) < 8 or settled[-1][0] - settled[0][0] < min_span_s:
                continue
            n = len(settled)
            early = [v for _, v in settled[: n // 4]]
            late = [v for _, v in settled[3 * n // 4:]]
            growth = sum(late) / len(late) - sum(early) / len(early)
            if growth > worst:
                span = settled[-1][0] - settled[0][0]
                worst, who = growth, f"{kind} pid {pid} ({early[0]:.0f} -> {late[-1]:.0f} MB over {span:.0f} s)"
        return round(worst, 1), who


def leftovers(root: Path, marker: str) -> dict[int, str]:
    """Processes (not zombies) of this soak still alive: command line or cwd under ``root``, or
    ``SOAK_MARKER=marker`` in their environment."""
    me = os.getpid()
    found: dict[int, str] = {}
    needle = f"{MARKER_ENV}={marker}".encode()
    for pid in _pids():
        if pid == me or not detached.alive(pid):
            continue
        argv = " ".join(_cmdline(pid))
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            environ = b""
        if str(root) in argv or cwd.startswith(str(root)) or needle in environ.split(b"\0"):
            found[pid] = argv[:200]
    return found


def kill_all(pids: dict[int, str]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
