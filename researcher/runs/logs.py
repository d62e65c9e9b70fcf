"""A run's log files, their size caps, and what the researcher reads in them.

Each run dir holds its server's output (``server.log``) and its client's (``client.log``, appended to
by every client start: a client's output begins at the offset recorded when it started). `swarm run`
ends with a summary line (``finished=N aborted=M``) and logs each aborted episode's first line.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

LOG_MAX_BYTES = 64 * 2**20  # a run's log beyond this is rotated (ResearcherSettings.log_max_mb)
LOG_KEEP = 2  # rotated copies kept: <log>.1 (newest) .. <log>.<keep> (ResearcherSettings.log_keep)
SERVER_LOG = "server.log"
CLIENT_LOG = "client.log"
SUMMARY = re.compile(r"finished=(\d+) aborted=(\d+)")
VIOLATION = re.compile(r"^sandbox violation: (.+)$", re.MULTILINE)  # `swarm run --box`'s report of a denial
ABORTED = re.compile(r"(episode \S+ of task \S+ aborted: .*)")  # the runner's log line of an aborted episode


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def log_size(path: Path) -> int:
    """A log's size in bytes (0 if it does not exist yet): where the next process's output starts."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "(no output)"



def _shift(path: Path, keep: int) -> None:
    """Make room for a new ``path.1``: ``path.<n>`` becomes ``path.<n+1>``; ``path.<keep>`` goes."""
    path.with_name(f"{path.name}.{keep}").unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))


def rotate(path: Path, keep: int = LOG_KEEP) -> None:
    """``path`` becomes ``path.1`` (older copies shift up, ``keep`` are kept): for a file whose writers
    open it anew for every write (the study's events.jsonl)."""
    _shift(path, keep)
    if keep > 0 and path.exists():
        os.replace(path, path.with_name(f"{path.name}.1"))
    else:
        path.unlink(missing_ok=True)


def cap(path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> int:
    """Keep a log that a detached process appends to (``O_APPEND``, ``detached.spawn``) under
    ``max_bytes``: beyond it, copy it to ``path.1`` (older copies shift up, ``keep`` are kept) and
    truncate it in place, as logrotate's ``copytruncate`` does, since the writer's descriptor cannot
    follow a rename. Returns the bytes cut from ``path`` (0 when under the cap): a reader's offset into
    it moves back by that much. Lines written between the copy and the truncation are lost."""
    size = log_size(path)
    if size <= max_bytes:
        return 0
    if keep > 0:
        _shift(path, keep)
        shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    with open(path, "r+b") as file:
        file.truncate(0)
    return size
