"""``terminate``: SIGTERM a process a test started and check it ends in time and leaves no process.

Read with ``ps`` (the issue's words: "tested with real processes and ``ps``"): the family of a process
is every descendant of it and every member of those descendants' process groups, taken just before
the signal; a family member still alive (not a zombie) after the process exited was left behind,
whatever its parent is by then (init adopts orphans). The survivors are SIGKILLed before the test fails,
so a failing test leaves nothing either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time


def _table() -> list[tuple[int, int, int, str, str]]:
    """(pid, ppid, pgid, state, command) of every process, from ``ps``."""
    out = subprocess.run(["ps", "-ww", "-e", "-o", "pid=,ppid=,pgid=,stat=,args="], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        pid, ppid, pgid, stat, *args = line.split(None, 4)
        rows.append((int(pid), int(ppid), int(pgid), stat, args[0] if args else ""))
    return rows


def family(pid: int) -> dict[int, str]:
    """``pid``'s descendants and the members of their process groups (not ``pid`` itself): pid -> command."""
    rows = _table()
    found = {pid}
    grew = True
    while grew:
        grew = False
        groups = {pgid for p, _, pgid, _, _ in rows if p in found and p != pid} | {pid}
        for p, ppid, pgid, _, _ in rows:
            if p not in found and (ppid in found or (pgid in groups and pgid != os.getpgid(0))):
                found.add(p)
                grew = True
    return {p: cmd for p, _, _, _, cmd in rows if p in found and p != pid}


def living(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` still running (zombies are dead: only their parent's wait is missing)."""
    return {p: cmd for p, _, _, stat, cmd in _table() if p in pids and not stat.startswith("Z")}


def terminate(proc: subprocess.Popen, within_s: float = 10.0) -> tuple[float, int, dict[int, str]]:
    """SIGTERM ``proc``; (seconds it took to exit, its exit code, the family it had). Fails the test if
    it is still running after ``within_s`` or any of its family outlives it (all SIGKILLed first)."""
    kin = family(proc.pid)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        _kill(kin)
        raise AssertionError(f"pid {proc.pid} still ran {within_s:g} s after SIGTERM (SIGKILLed)") from None
    took = time.monotonic() - started
    deadline = time.monotonic() + 1.0  # a child the process stopped may take a moment to be reaped
    while living(kin) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = living(kin)
    _kill(left)
    assert not left, f"left behind after {took:.1f} s: {left}"
    return took, code, kin


def _kill(pids: dict[int, str]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
