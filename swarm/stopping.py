"""Clean stops for the command-line processes: SIGTERM takes Ctrl-C's path, within a deadline, and
takes the process's children with it.

A supervisor (systemd, Kubernetes, docker, a test, the researcher stopping a run) sends SIGTERM and
SIGKILLs after its own grace period (docker: 10 s); a person sends SIGINT. Both take one path here:

- ``interrupt_on_sigterm()``: SIGTERM raises ``KeyboardInterrupt`` in the main thread, so the code's
  Ctrl-C path (finish or abort the work in flight, close files, stop children) runs for both. The
  main thread waits with ``wait_interruptibly``: a signal another thread caught reaches it only when
  it wakes.
- ``arm_deadline()``: the first stop signal starts a clock. A process still alive when it runs out
  (a peer that does not answer, user code that hangs, a non-daemon thread that never returns) kills
  the children it started with ``start_child`` and exits at once, with status 128 + the signal; a
  second signal does so immediately. ``interrupt_on_sigterm`` arms it; uvicorn-based processes, whose
  own handler takes the signals, call ``on_stop_signal`` from that handler.
- ``start_child`` / ``stop_child`` / ``stop_children``: a child in its own process group (so a
  terminal's Ctrl-C does not reach it half-way through our shutdown), which a stop ends whole:
  SIGTERM to the group, SIGKILL after a grace period. ``run_child`` runs one in the foreground
  (``researcher ui``'s MLflow server). ``stop_group`` is the same for a group this process did not start.

Standard library only, and no side effect at import: every ``swarm`` and ``researcher`` process may
use it. Linux and macOS (process groups); the process-group scan reads ``/proc`` where there is one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["DEADLINE_S", "arm_deadline", "exit_now", "group_alive", "interrupt_on_sigterm", "on_stop_signal",
           "run_child", "start_child", "stop_child", "stop_children", "stop_group", "wait_interruptibly"]

log = logging.getLogger(__name__)

DEADLINE_S = 8.0  # from the first stop signal to a forced exit: under a supervisor's usual 10 s
CHILD_GRACE_S = 3.0  # a child's SIGTERM-to-SIGKILL grace within that deadline

_lock = threading.Lock()
_children: set[subprocess.Popen[Any]] = set()
_armed_at: float | None = None
_handled = 0  # stop signals the handlers have run for (on_stop_signal)
_watching = False  # the wakeup-fd watcher has started


def interrupt_on_sigterm(deadline_s: float = DEADLINE_S) -> None:
    """From now on SIGTERM and SIGINT raise ``KeyboardInterrupt`` in the main thread (the first one)
    and arm the deadline; a second one exits at once. Call it from the main thread.

    The kernel may hand a process's signal to any of its threads; then Python only marks its handler
    due, and a main thread blocked in an untimed wait (``Future.result()``, a lock, a join) does not
    run it until that wait ends, maybe never. So a watcher thread reads the signal wakeup fd and arms
    the deadline (exits on a second signal) whichever thread caught it; the main thread's own waits
    should still be timed (``wait_interruptibly``) so that the clean path runs too."""

    def handler(signum: int, frame: FrameType | None) -> None:
        on_stop_signal(signum, deadline_s)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    _watch_stop_signals(deadline_s)


def wait_interruptibly(futures: Sequence[Future[Any]], poll_s: float = 0.25) -> None:
    """``future.result()`` for each of ``futures`` (the first failure raises), waking every ``poll_s``
    so that a stop signal caught by another thread reaches the main thread within that time."""
    pending: Iterable[Future[Any]] = futures
    while pending:
        done, pending = wait(pending, timeout=poll_s, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()


def _watch_stop_signals(deadline_s: float) -> None:
    """Start the wakeup-fd watcher once per process (see ``interrupt_on_sigterm``). Not where the wakeup
    fd is someone else's (an asyncio loop's). A forked child drops it: its signals are its own."""
    global _watching
    if _watching:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    if signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False) != -1:  # taken: give it back
        signal.set_wakeup_fd(-1)
        os.close(read_fd)
        os.close(write_fd)
        return
    _watching = True
    os.register_at_fork(after_in_child=lambda: signal.set_wakeup_fd(-1))

    def watch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # never the thread they land on
        seen = 0
        while chunk := os.read(read_fd, 64):
            for signum in chunk:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    seen += 1
                    if seen == 1:
                        arm_deadline(deadline_s, signum)
                    else:
                        exit_now(signum, "a second stop signal")

    threading.Thread(target=watch, name="stop-signal-watcher", daemon=True).start()


def on_stop_signal(signum: int, deadline_s: float = DEADLINE_S) -> None:
    """What every stop signal does before the process's own shutdown starts: the first arms the
    deadline, a second exits at once. For handlers of their own (uvicorn's ``handle_exit``). It counts
    the signals the handlers ran for, not whether the deadline is armed: the wakeup-fd watcher may have
    armed it for this same signal. Python runs handlers in the main thread only: no lock (one taken
    here could be the one the interrupted code holds)."""
    global _handled
    _handled += 1
    if _handled > 1:
        exit_now(signum, "a second stop signal")
    arm_deadline(deadline_s, signum)


def arm_deadline(deadline_s: float = DEADLINE_S, signum: int = signal.SIGTERM) -> bool:
    """Start the stop clock: after ``deadline_s`` the process exits whatever it is doing. True the
    first time; False when a stop was already under way (the caller decides whether to hurry)."""
    global _armed_at
    with _lock:
        if _armed_at is not None:
            return False
        _armed_at = time.monotonic()
    timer = threading.Timer(deadline_s, exit_now, args=(signum, f"still stopping after {deadline_s:g} s"))
    timer.daemon = True
    timer.start()
    return True


def exit_now(signum: int, why: str) -> None:
    """Kill the children started here, then leave the process at once (no cleanup beyond that)."""
    with _lock:
        children = list(_children)
    sys.stderr.write(f"{why}: exiting now ({len(children)} child process group(s) killed)\n")
    for child in children:
        _signal_group(child.pid, signal.SIGKILL)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(128 + int(signum))


def start_child(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)`` in its own process group, remembered until ``stop_child``
    (a forced exit kills it too)."""
    child = subprocess.Popen(list(argv), start_new_session=True, **popen)
    with _lock:
        _children.add(child)
    return child


def run_child(argv: Sequence[str], **popen: Any) -> int:
    """Run ``argv`` in its own process group until it exits, or until SIGTERM or Ctrl-C end this
    process: then the whole group is ended (``stop_child``), so nothing it started is left serving.
    Its exit code; 0 after such a stop. Call it from the main thread."""
    interrupt_on_sigterm()
    child = None
    try:
        with _stop_signals_held():
            child = start_child(argv, **popen)
        return child.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if child is not None:
            stop_child(child)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold SIGTERM and SIGINT's handlers until the block ends, then run them for what came. A signal
    inside ``Popen`` after its fork (it waits there for the exec) raised out of it and left a child
    nobody held the pid of: it kept serving after this process exited. Main thread only."""
    held: list[int] = []
    previous = {int(signum): signal.signal(signum, lambda signum, _frame: held.append(signum))
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        handler = previous[held[0]] if held else None
        if callable(handler):
            handler(held[0], None)


def stop_child(child: subprocess.Popen[Any], grace_s: float = CHILD_GRACE_S) -> int | None:
    """End ``child``'s process group (SIGTERM, SIGKILL after ``grace_s``); its exit status."""
    try:
        stop_group(child.pid, grace_s, reap=child.poll)
    finally:
        with _lock:
            _children.discard(child)
    return child.poll()


def stop_children(grace_s: float = CHILD_GRACE_S) -> None:
    """End every child started with ``start_child`` and not yet stopped, all at once: SIGTERM to each
    group, SIGKILL to what is left after ``grace_s``."""
    with _lock:
        children = list(_children)
    for child in children:
        _signal_group(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(child.poll() is None or group_alive(child.pid) for child in children):
        time.sleep(0.05)
    for child in children:
        stop_child(child, grace_s=0.0)


def stop_group(pgid: int, grace_s: float = CHILD_GRACE_S, *, reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM process group ``pgid``, then SIGKILL what is left of it after ``grace_s``. ``reap`` runs
    while waiting: a parent reaps its child leader there, which would otherwise linger as a zombie."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not _signal_group(pgid, sig):
            reap()
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap()
            if not group_alive(pgid):
                return
            time.sleep(0.05)
    log.warning("process group %d outlived SIGKILL (a process in uninterruptible sleep?)", pgid)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process belongs to process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc (macOS): any member, zombies included
        return _signal_group(pgid, 0)
    for stat_file in proc.glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when no such group exists (any more)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a recycled id of another user's group: not ours
        return False
    return True
