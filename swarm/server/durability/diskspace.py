"""Whether the disk under the state dir has room, and which errors say it has none.

Why: a full disk is a state the server reports, not a crash. A write that fails
for want of space rolls back and is answered 507 (``errors.InsufficientStorage``) or retried, and new
claims are refused while the disk is full, so the room left goes to the episodes already running.

``DiskMonitor`` decides "full" cheaply: ``shutil.disk_usage`` (one ``statvfs``) at most once every
``ttl_s``, against ``reserve_bytes``. A write that really failed (``failed``) keeps the disk full
until more space has come free than there was at the failure (by the reserve, at least 1 MiB), a
later write succeeds (``succeeded``), or ``forget_s`` passes (a quota, which free space does not
show, is then probed again by the next write). ``is_disk_full`` recognises what a full disk raises:
``OSError`` ENOSPC or EDQUOT, SQLite's SQLITE_FULL, and the messages of libraries that wrap them
(safetensors). torch's own writer says only "unexpected pos", so a failed checkpoint is also called
a full disk when the measured free space is below the reserve (``explains``).

Not thread-safe by design: the event loop thread is its only caller.
"""

from __future__ import annotations

import errno
import logging
import math
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from swarm.protocol import DiskStatus, Event

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RESERVE_BYTES", "RETRY_AFTER_S", "DiskMonitor", "EventSink", "QuietEventLog", "is_disk_full"]

DEFAULT_RESERVE_BYTES = 64 * 2**20  # ample for thousands of finishes (kilobytes each) and a step's commit
RETRY_AFTER_S = 1.0  # what a 507 tells a client to wait, and how often training tries its writes again
_MIN_MARGIN = 2**20
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_MESSAGES = ("no space left on device", "database or disk is full", "disk quota exceeded")



def is_disk_full(exc: BaseException | None) -> bool:
    """``exc``, or an error it was raised from, says the disk (or a quota) is full."""
    for _ in range(8):  # the cause chain; bounded, a chain can be cyclic
        if exc is None:
            return False
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if any(message in str(exc).lower() for message in _FULL_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class DiskMonitor:
    """Free space under ``path`` and whether it counts as full (see the module docstring)."""

    def __init__(self, path: str | Path, *, reserve_bytes: int = DEFAULT_RESERVE_BYTES, ttl_s: float = 1.0,
                 forget_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 free_bytes: Callable[[Path], int] = lambda path: shutil.disk_usage(path).free) -> None:
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
        self.path = Path(path)
        self.reserve_bytes = reserve_bytes
        self._ttl_s = ttl_s
        self._forget_s = forget_s
        self._clock = clock
        self._free_bytes = free_bytes  # a seam for tests of the rules; the default is one statvfs
        self._margin = max(reserve_bytes, _MIN_MARGIN)
        self._free = 0
        self._measured_at = -math.inf
        self._failure: tuple[str, int, float] | None = None  # (reason, free bytes then, when)

    def check(self) -> DiskStatus:
        """The disk's state, measured at most once every ``ttl_s``."""
        now = self._clock()
        if now - self._measured_at >= self._ttl_s:
            self._measure(now)
        return self._status()

    @property
    def full(self) -> bool:
        return self.check().full

    def failed(self, where: str, exc: BaseException) -> None:
        """A write under the state dir (``where``) failed for want of space: full from now on."""
        now = self._clock()
        self._measure(now)
        was_full = self._status().full
        self._failure = (f"{where} failed: {exc}", self._free, now)
        if not was_full:  # once a full spell, not once a retry
            log.warning("disk full under %s: %s failed (%s); %d bytes free", self.path, where, exc, self._free)

    def succeeded(self) -> None:
        """A write went through: a noted failure no longer holds (the reserve still does)."""
        if self._failure is not None:
            log.info("writes under %s succeed again", self.path)
            self._failure = None

    def explains(self, exc: BaseException) -> bool:
        """A failed write (a checkpoint) was for want of space: its error says so, or the disk is below
        its reserve right now (measured afresh)."""
        if is_disk_full(exc):
            return True
        self._measure(self._clock())
        return self._free < self.reserve_bytes


    def _measure(self, now: float) -> None:
        try:
            self._free = int(self._free_bytes(self.path))
        except OSError as exc:  # the state dir vanished or is unreadable: keep the last reading
            log.warning("cannot measure free space under %s: %s", self.path, exc)
        self._measured_at = now
        if self._failure is not None:
            _, free_then, at = self._failure
            if self._free >= free_then + self._margin or now - at >= self._forget_s:
                log.info("disk under %s has room again (%d bytes free)", self.path, self._free)
                self._failure = None

    def _status(self) -> DiskStatus:
        if self._failure is not None:
            reason = self._failure[0]
        elif self._free < self.reserve_bytes:
            reason = f"{self._free} bytes free under {self.path}, below the reserve of {self.reserve_bytes}"
        else:
            reason = ""
        return DiskStatus(full=bool(reason), free_bytes=self._free, reserve_bytes=self.reserve_bytes, reason=reason)


class EventSink(Protocol):
    """Where events are persisted (``swarm.server.durability.store.EpisodeStore``)."""

    def append_event(self, event: Event) -> None: ...


class QuietEventLog:
    """The event log as a best-effort record on a disk that may fill: a write a full disk refuses is
    noted on the monitor (logged once per full spell), not raised; other errors are raised as before."""

    def __init__(self, sink: EventSink, disk: DiskMonitor) -> None:
        self._sink = sink
        self._disk = disk

    def append_event(self, event: Event) -> None:
        try:
            self._sink.append_event(event)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._disk.failed("recording an event", exc)
        else:
            self._disk.succeeded()
