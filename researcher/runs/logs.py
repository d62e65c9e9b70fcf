"""A run's log files and what the researcher reads in them.

Each run dir holds its server's output (``server.log``) and its client's (``client.log``, appended to
by every client start: a client's output begins at the offset recorded when it started). `swarm run`
ends with a summary line (``finished=N aborted=M``) and logs each aborted episode's first line.
"""

from __future__ import annotations

import re
from pathlib import Path

SERVER_LOG = "server.log"
CLIENT_LOG = "client.log"
SUMMARY = re.compile(r"finished=(\d+) aborted=(\d+)")
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
