"""A local spool of MLflow writes for when the tracking store is unreachable.

Each write the tracker could not deliver is appended to ``spool.jsonl`` (one JSON op a line) and
replayed, in order, once the store answers again; a run created while the store was down gets a
local id (``local-…``) that ``ids.json`` maps to the real run id after replay, so later writes to it
land in the right run. A study never dies because MLflow is down: its numbers wait on disk.

A line that does not parse as an op (a write cut short by a crash or a full disk, a hand edit) is
moved to ``spool.bad`` when the spool is replayed, and replay goes on with the next line: one bad
line must not hold back every later write. An append after a cut-short last line starts on a new
line, so the cut never swallows the op written after it.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOCAL_PREFIX = "local-"


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ops_file = folder / "spool.jsonl"
        self.ids_file = folder / "ids.json"
        self.bad_file = folder / "spool.bad"

    @staticmethod
    def new_local_id() -> str:
        return LOCAL_PREFIX + uuid.uuid4().hex

    def pending(self) -> int:
        if not self.ops_file.is_file():
            return 0
        return sum(1 for line in self._lines())

    def append(self, op: str, args: Mapping[str, object]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"op": op, "args": args}, default=str) + "\n"
        with open(self.ops_file, "a+b") as out:
            if out.tell() and _last_byte(out) != b"\n":  # the previous write was cut short
                line = "\n" + line
            out.write(line.encode())
            out.flush()
            os.fsync(out.fileno())

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
        tmp = self.ids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(ids, indent=1))
        os.replace(tmp, self.ids_file)

    def replay(self, apply: Callable[[str, dict[str, Any]], object]) -> int:
        """Apply the spooled ops in order; stop at the first failure (re-raised) keeping the rest.
        Lines that are not ops move to ``spool.bad``. Returns how many were applied."""
        if not self.ops_file.is_file():
            return 0
        lines = self._lines()
        done = 0
        bad: list[str] = []
        try:
            for line in lines:
                item = _parse(line)
                if item is None:
                    bad.append(line)
                else:
                    apply(*item)
                done += 1
        finally:
            if bad:
                self._set_aside(bad)
            rest = lines[done:]
            tmp = self.ops_file.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in rest))
            os.replace(tmp, self.ops_file)
        return done - len(bad)

    def _lines(self) -> list[str]:
        # "\n" only: ops are ASCII JSON (other line breaks are escaped); garbage bytes are replaced.
        return [line for line in self.ops_file.read_text(errors="replace").split("\n") if line.strip()]

    def _set_aside(self, lines: list[str]) -> None:
        log.warning("%d unreadable line(s) of %s moved to %s", len(lines), self.ops_file, self.bad_file)
        with open(self.bad_file, "a") as out:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())


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
