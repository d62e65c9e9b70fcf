"""Kill the Ray processes a server started once that server is gone, however it went (SIGKILL too).

Run as a script (``python _watchdog.py PARENT_PID``; it imports only psutil, not the package, so it
costs a few MB). While the parent lives it snapshots the parent's Ray descendants every interval;
when the parent disappears (this process is re-parented) it SIGKILLs every process it saw that is
still the same process (pid and start time), then exits.

Why: Ray's own fate-sharing (``PR_SET_PDEATHSIG`` on GCS and raylet; workers follow their raylet)
leaves the dashboard and runtime-env agents running for a long time after a hard kill.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

_RAY_NAMES = ("raylet", "gcs_server")


def _is_ray(proc: psutil.Process) -> bool:
    try:
        name = proc.name()
        if name in _RAY_NAMES or name.startswith("ray::"):
            return True
        return any("/ray/" in part for part in proc.cmdline()[:3])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _snapshot(parent: psutil.Process) -> dict[int, float]:
    """Ray descendants of ``parent`` as {pid: create_time}."""
    out: dict[int, float] = {}
    try:
        for proc in parent.children(recursive=True):
            if proc.pid != os.getpid() and _is_ray(proc):
                try:
                    out[proc.pid] = proc.create_time()
                except psutil.NoSuchProcess:
                    continue
    except psutil.NoSuchProcess:
        pass
    return out


def _kill(snapshot: dict[int, float]) -> None:
    for pid, created in snapshot.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:  # not a recycled pid
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def main(parent_pid: int, interval_s: float = 0.5) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the server's terminal is for the server
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    # A union over time: an agent re-parented away from a dying raylet is still remembered; the
    # start-time check in _kill keeps a recycled pid safe.
    snapshot: dict[int, float] = {}
    while os.getppid() == parent_pid and parent.is_running():
        snapshot.update(_snapshot(parent))
        time.sleep(interval_s)
    _kill(snapshot)


if __name__ == "__main__":
    main(int(sys.argv[1]))
