"""``wait_for``: poll a condition until it holds, or fail the test saying what never happened.

Every wait in the tests goes through it, so a timeout always reads the same way: what was awaited,
for how long, and (when a process was involved) that process's exit code and the tail of its log.
A negative check ("X did not happen") never waits a fixed time: wait for a later event that proves
the moment has passed, then assert the absence.
"""

from __future__ import annotations

import linecache
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

LOG_TAIL = 3000  # characters of a log shown with a failure


def wait_for(condition: Callable[[], T], timeout: float = 20.0, *, what: str | Callable[[], str] | None = None,
             interval: float = 0.05, proc: subprocess.Popen | None = None, log: Path | None = None) -> T:
    """Call ``condition`` every ``interval`` s until it returns something truthy and return that.

    ``what`` names the awaited event in the failure (default: the condition's source line); a
    callable is asked only then, for details known at the end.
    ``proc``: stop waiting at once if that process exits (a dead server never becomes ready);
    ``log``: a file whose tail the failure shows."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"gave up waiting for {_describe(condition, what)}: the process exited with "
                        f"{proc.returncode}{_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for {_describe(condition, what)}, in vain{_tail(log)}")
        time.sleep(interval)


def _describe(condition: Callable[[], object], what: str | Callable[[], str] | None) -> str:
    if what:
        return what() if callable(what) else what
    code = getattr(condition, "__code__", None)
    if code is None:
        return repr(condition)
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    return f"{line!r} ({Path(code.co_filename).name}:{code.co_firstlineno})"


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return f"\n--- {log.name} (tail) ---\n{log.read_text(errors='replace')[-LOG_TAIL:]}"
