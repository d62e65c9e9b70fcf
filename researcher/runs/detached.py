"""Detached processes: start them in their own session, check them by pid, stop their group.

Runs are started with ``start_new_session=True`` so a researcher crash (even SIGKILL) does not
take its training runs down; a resumed researcher finds them again by the pid and the process
start time recorded in run.json (the start time guards against a recycled pid). Stopping a run
stops its whole process group, including processes its leader left behind after it exited.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swarm import stopping


def spawn(argv: Sequence[str], *, log_path: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None,
          preexec: Callable[[], None] | None = None) -> tuple[int, float | None]:
    """Start ``argv`` detached with stdout+stderr appended to ``log_path``; returns (pid, start time).

    ``env`` is the child's whole environment (None: this process's); ``preexec`` runs in the child
    before exec (resource limits)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=None if env is None else dict(env), start_new_session=True,
                                preexec_fn=preexec)
    return proc.pid, start_time(proc.pid)


def start_time(pid: int) -> float | None:
    """The process start time in clock ticks since boot (Linux /proc), or None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return float(fields[19])


def alive(pid: int | None, started: float | None = None) -> bool:
    """True while ``pid`` runs (not a zombie) and is the same process that was started."""
    if not pid:
        return False
    try:
        # Reap it if it is our child, so an exited child does not linger as a zombie.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat[stat.rindex(")") + 2:].split()[0]
    if state in ("Z", "X"):
        return False
    return started is None or start_time(pid) == started


def stop_group(pid: int | None, started: float | None = None, *, grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL what is left of it after ``grace_s``
    (``swarm.stopping.stop_group``).

    The group is stopped even when its leader has exited: a leader started with its own session
    leads a group of the same id, and the kernel does not hand that id to a new process while any
    member lives, so members found under it are the leader's. Only a leader whose pid now names a
    different process (a recycled pid) means the group is gone."""
    if pid is None or not _owns_group(pid, started):
        return
    stopping.stop_group(pid, grace_s, reap=lambda: alive(pid, started))  # reaps the leader when it is our child


def _owns_group(pid: int, started: float | None) -> bool:
    if alive(pid, started):
        return True
    if started is None:
        return False  # no start time to tell a recycled pid from ours: leave it alone
    now = start_time(pid)
    return now is None or now == started  # gone (its group may live on) or our zombie


def wait_exit(pid: int | None, started: float | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``pid`` to exit; True when it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid, started):
            return True
        time.sleep(0.1)
    return not alive(pid, started)
