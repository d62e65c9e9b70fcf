"""A local spool of MLflow writes for when the tracking store is unreachable.

Each write the tracker could not deliver is appended to ``spool.jsonl`` (one JSON op a line) and
replayed, in order, once the store answers again; a run created while the store was down gets a
local id (``local-…``) that ``ids.json`` maps to the real run id after replay, so later writes to it
land in the right run. A study never dies because MLflow is down: its numbers wait on disk.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOCAL_PREFIX = "local-"


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ops_file = folder / "spool.jsonl"
        self.ids_file = folder / "ids.json"

    @staticmethod
    def new_local_id() -> str:
        return LOCAL_PREFIX + uuid.uuid4().hex

    def pending(self) -> int:
        if not self.ops_file.is_file():
            return 0
        return sum(1 for line in self.ops_file.read_text().splitlines() if line.strip())

    def append(self, op: str, args: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.ops_file, "a") as out:
            out.write(json.dumps({"op": op, "args": args}, default=str) + "\n")
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

    def replay(self, apply: Callable[[str, dict[str, Any]], None]) -> int:
        """Apply the spooled ops in order; stop at the first failure (re-raised) keeping the rest.
        Returns how many were applied."""
        if not self.ops_file.is_file():
            return 0
        lines = [line for line in self.ops_file.read_text().splitlines() if line.strip()]
        done = 0
        try:
            for line in lines:
                item = json.loads(line)
                apply(item["op"], item["args"])
                done += 1
        finally:
            rest = lines[done:]
            tmp = self.ops_file.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in rest))
            os.replace(tmp, self.ops_file)
        return done
