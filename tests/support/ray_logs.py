"""What a dead Ray worker left behind, for a failure report: its own stderr and what raylet said of it.

Ray's ``ActorDiedError`` names the worker's pid but not why it died (OOM killer, a signal, an abort
in gloo); the worker's ``.err`` file and raylet's lines about that pid usually do. Ray keeps them
under ``/tmp/ray/session_*/logs``; nothing here starts or asks Ray.
"""

from __future__ import annotations

import re
from pathlib import Path

RAY_ROOT = Path("/tmp/ray")
_DEAD_PID = re.compile(r"ActorDiedError.*?\bpid: (\d+)", re.DOTALL)


def dead_worker_pids(report_text: str) -> list[int]:
    """The pids of the Ray workers an ``ActorDiedError`` in ``report_text`` names, in order, once each."""
    pids = [int(m.group(1)) for m in _DEAD_PID.finditer(report_text)]
    return list(dict.fromkeys(pids))


def worker_post_mortem(pid: int, root: Path = RAY_ROOT, lines: int = 40) -> str:
    """The last ``lines`` of the worker's stderr and raylet's lines that mention ``pid``, from the newest
    session that has a log of that pid ("" when none has)."""
    sessions = sorted(root.glob("session_2*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for session in sessions:
        logs = session / "logs"
        errs = list(logs.glob(f"worker-*-{pid}.err"))
        if not errs:
            continue
        parts = [f"== {errs[0]} (last {lines} lines)", *_tail(errs[0], lines)]
        raylet = [line for line in _tail(logs / "raylet.out", 20000) if f"pid={pid}" in line or f" {pid}" in line]
        parts += [f"== {logs / 'raylet.out'} (lines naming pid {pid})", *raylet[-lines:]]
        return "\n".join(parts)
    return ""


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None where /proc does not say):
    a worker killed that way leaves no line of its own."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
