"""A local spool of MLflow writes for when the tracking store is unreachable.

Each write the tracker could not deliver is appended to ``spool.jsonl`` (one JSON op a line) and
replayed, in order, once the store answers again; a run created while the store was down gets a
local id (``local-…``) that ``ids.json`` maps to the real run id after replay, so later writes to it
land in the right run. A study never dies because MLflow is down: its numbers wait on disk.

A line that does not parse as an op (a write cut short by a crash or a full disk, a hand edit) is
moved to ``spool.bad`` when the spool is replayed, and replay goes on with the next line: one bad
line must not hold back every later write. An append after a cut-short last line starts on a new
line, so the cut never swallows the op written after it.

On a full disk (ENOSPC, a quota) the spool keeps whole records only: an append the disk cuts short
is truncated back, and the op is held in memory, written before the next one and replayed after the
file's, so nothing raises and the order holds. A replay whose rewrite of the file the disk refuses
remembers (in memory) how many of its first lines were applied, so this process applies none twice.
What is still held when the process ends is lost (``held`` says how many; the session names them).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from swarm.atomic import write_atomic

log = logging.getLogger(__name__)

LOCAL_PREFIX = "local-"
_FULL = (errno.ENOSPC, errno.EDQUOT)  # what a full disk (or a quota) raises


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ops_file = folder / "spool.jsonl"
        self.ids_file = folder / "ids.json"
        self.bad_file = folder / "spool.bad"
        self._held: list[str] = []  # whole op lines the disk refused, oldest first (after the file's)
        self._applied = 0  # the file's first lines a replay applied but could not cut from it (a full disk)

    @staticmethod
    def new_local_id() -> str:
        return LOCAL_PREFIX + uuid.uuid4().hex

    def pending(self) -> int:
        return (len(self._lines()) if self.ops_file.is_file() else 0) + len(self._held)

    @property
    def held(self) -> int:
        """Ops only in memory: the disk refused them and has not taken them since."""
        return len(self._held)

    def append(self, op: str, args: Mapping[str, object]) -> None:
        """Spool one op: appended whole (with any the disk refused before it), or held in memory."""
        self._held.append(json.dumps({"op": op, "args": args}, default=str))
        try:
            self._write(self._held)
        except OSError as exc:
            if exc.errno not in _FULL:
                self._held.pop()
                raise
            log.warning("the disk refused the MLflow spool %s (%s): %d write(s) held in memory until it has room",
                        self.ops_file, exc.strerror, len(self._held))
            return
        self._held.clear()

    def _write(self, lines: list[str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = "".join(line + "\n" for line in lines)
        with open(self.ops_file, "a+b") as out:
            start = out.tell()
            if start and _last_byte(out) != b"\n":  # the previous write was cut short (a crash)
                data = "\n" + data
            try:
                out.write(data.encode())
                out.flush()
                os.fsync(out.fileno())
            except OSError:
                out.truncate(start)  # whole records only
                raise

    def ids(self) -> dict[str, str]:
        return json.loads(self.ids_file.read_text()) if self.ids_file.is_file() else {}

    def real_id(self, run_id: str | None) -> str | None:
        """The MLflow id of ``run_id`` (itself unless it is a local id); None if not created yet."""
        if run_id is None or not run_id.startswith(LOCAL_PREFIX):
            return run_id
        return self.ids().get(run_id)

    def map_id(self, local: str, real: str) -> None:
        ids = self.ids()
        ids[local] = real
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.ids_file, json.dumps(ids, indent=1))

    def replay(self, apply: Callable[[str, dict[str, Any]], object]) -> int:
        """Apply the spooled ops in order (the file's, then those held in memory); stop at the first
        failure (re-raised) keeping the rest. Lines that are not ops move to ``spool.bad``. Returns how
        many were applied."""
        if not self.pending():
            return 0
        in_file = self._lines() if self.ops_file.is_file() else []
        done = 0
        bad: list[str] = []
        try:
            for line in [*in_file, *self._held]:
                item = _parse(line)
                if item is None:
                    bad.append(line)
                else:
                    apply(*item)
                done += 1
        finally:
            if bad:
                self._set_aside(bad)
            self._cut(in_file, done)
        return done - len(bad)

    def _cut(self, in_file: list[str], done: int) -> None:
        """Drop the first ``done`` ops replayed: from memory, and from the file by rewriting it (when the
        disk refuses that, the file keeps them and ``_applied`` skips them)."""
        from_file = min(done, len(in_file))
        del self._held[:done - from_file]
        if not from_file:
            return
        try:
            write_atomic(self.ops_file, "".join(line + "\n" for line in in_file[from_file:]))
        except OSError as exc:
            if exc.errno not in _FULL:
                raise
            log.warning("the disk refused to rewrite %s (%s): %d replayed op(s) stay in it, skipped by this process",
                        self.ops_file, exc.strerror, self._applied + from_file)
            self._applied += from_file
        else:
            self._applied = 0

    def _lines(self) -> list[str]:
        # "\n" only: ops are ASCII JSON (other line breaks are escaped); garbage bytes are replaced.
        lines = [line for line in self.ops_file.read_text(errors="replace").split("\n") if line.strip()]
        return lines[self._applied:]

    def _set_aside(self, lines: list[str]) -> None:
        log.warning("%d unreadable line(s) of %s moved to %s", len(lines), self.ops_file, self.bad_file)
        try:
            with open(self.bad_file, "a") as out:
                out.write("".join(line + "\n" for line in lines))
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:  # they are unreadable anyway: kept for a person only when there is room
            log.warning("could not keep them in %s: %s", self.bad_file, exc)


def _parse(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(op, args)`` of a spool line, or None if it is not one (``args`` as the tracker wrote them:
    each op reads its own keys)."""
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if not isinstance(item, dict) or not isinstance(item.get("op"), str) or not isinstance(item.get("args"), dict):
        return None
    return item["op"], item["args"]


def _last_byte(out: Any) -> bytes:
    out.seek(-1, os.SEEK_END)
    last = out.read(1)
    out.seek(0, os.SEEK_END)
    return bytes(last)
