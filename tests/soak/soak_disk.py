"""The soak's full disk (``--fill-disk``, issue #52): a tmpfs mounted as the studies' artifacts folder
(every run server's state dir, graph.db, events.jsonl, the MLflow spool), filled to the last byte at
seeded random times and freed after a while.

A spell is counted as observed (``disk_full_events``) when, while the disk was full, a live run's
server said so in its status (``disk.full``: claims, and finishes it cannot commit, answer 507) or a
study's events.jsonl got a ``disk_full`` event (a session that parked for want of space). The MLflow
server (the audit's evidence) and the undisturbed reference study stay on the ordinary disk, and the
study folders too (LOG.md and report.md are checked on a full disk by tests/e2e/researcher/test_study_disk_full.py).

Mounting needs root (or CAP_SYS_ADMIN): without it the soak stops before it starts, saying so.
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import time
from pathlib import Path

from support.disks import fill

from researcher.runs import detached
from researcher.runs import record as runs
from researcher.study.events import read_events

__all__ = ["DiskChaos"]



class DiskChaos:
    """Spells of a full disk under ``where``: each starts ``every`` seconds (drawn) after the last ended
    and lasts ``hold`` seconds (drawn); ``tick`` (once a second) starts, watches and ends them."""

    def __init__(self, where: Path, size_mb: int, rng: random.Random, every: tuple[float, float],
                 hold: tuple[float, float], say=print) -> None:
        self.where, self.size_mb, self.rng = where, size_mb, rng
        self.every, self.hold, self.say = every, hold, say
        self.filler: Path | None = None
        self.next_fill = time.time() + rng.uniform(*every)
        self.until = 0.0
        self.spells = 0  # disk-full spells made
        self.observed = 0  # of them, those a server or a study reported
        self._seen = False
        self._marks: dict[Path, int] = {}  # events.jsonl -> last event id before the spell
        self._next_probe = 0.0

    def mount(self) -> None:
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}M", "tmpfs", str(self.where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"--fill-disk mounts a {self.size_mb} MB tmpfs at {self.where}, which needs root or "
                               f"CAP_SYS_ADMIN: {done.stderr.strip() or done.returncode}")

    def unmount(self) -> None:
        self.end()
        if subprocess.run(["umount", str(self.where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True)  # still open: detach it

    def tick(self, runs_dirs: list[Path], events_files: list[Path]) -> None:
        now = time.time()
        if self.filler is None:
            if now >= self.next_fill:
                self._marks = {path: _last_id(path) for path in events_files}
                self.filler, self._seen = self._fill(), False
                hold = self.rng.uniform(*self.hold)
                self.until = time.time() + hold  # from when it is full (filling takes a while on a busy machine)
                self.say(f"disk full: filled {self.where} for {hold:.0f} s")
            return
        if not self._seen and now >= self._next_probe:
            self._next_probe = now + 2.0
            self._seen = _a_server_says_full(runs_dirs)
        if now >= self.until:
            self._seen = self._seen or any(_disk_full_event(p, self._marks.get(p, 0)) for p in events_files)
            self.end()

    def end(self) -> None:
        """Free the space (the filler deleted); the spell is counted."""
        if self.filler is None:
            return
        self.filler.unlink(missing_ok=True)
        self.filler = None
        self.spells += 1
        self.observed += int(self._seen)
        self.next_fill = time.time() + self.rng.uniform(*self.every)
        self.say(f"disk freed ({'reported' if self._seen else 'not seen by any server or study'})")

    def _fill(self) -> Path:
        return fill(self.where, f"filler-{self.spells}")


def _a_server_says_full(runs_dirs: list[Path]) -> bool:
    import httpx

    for runs_dir in runs_dirs:
        for record in runs.all_records(runs_dir):
            if record.status != "running" or not record.url or not detached.alive(record.server_pid,
                                                                                  record.server_started):
                continue
            token_file = Path(record.state_dir or "") / "token"
            with contextlib.suppress(OSError, httpx.HTTPError, ValueError):
                status = httpx.get(f"{record.url}/api/v1/status", timeout=2.0,
                                   headers={"Authorization": f"Bearer {token_file.read_text().strip()}"}).json()
                if (status.get("disk") or {}).get("full"):
                    return True
    return False


def _last_id(events_file: Path) -> int:
    events = read_events(events_file)
    return int(events[-1]["id"]) if events else 0


def _disk_full_event(events_file: Path, after_id: int) -> bool:
    return any(e["kind"] == "disk_full" for e in read_events(events_file, after_id))
