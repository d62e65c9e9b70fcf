"""Files written whole: the new content goes to a temporary file beside the target, renamed over it.

A reader of the target sees the old content or the new one, never half of either; a write the disk
refuses (ENOSPC) leaves the target as it was and removes its temporary file, so it holds no space.

- ``write_atomic(path, data)``: text or bytes, whole.
- ``replacing(path)``: a temporary path to write by any means (a parquet writer, a stream of rows),
  renamed over ``path`` when the block ends, removed when it raises.

``durable=True`` fsyncs the temporary file before the rename and the folder after it, so the new
content survives a power loss too; without it, what a killed process wrote is whole and the page
cache holds it (what server.json, cursors and the researcher's files need). The temporary file is
named for the writing process and thread (``.<name>.<pid>-<thread>.tmp``): two writers of one path
never write into each other's file, and the last rename wins, whole.

Standard library only, and no side effect at import: ``swarm`` and ``researcher`` alike use it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["replacing", "write_atomic"]


def write_atomic(path: Path, data: str | bytes, *, durable: bool = False) -> None:
    """``path`` holds ``data`` whole, or keeps what it held (its folder is created if missing)."""
    with replacing(path, durable=durable) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)


@contextmanager
def replacing(path: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (its folder created if missing); when the block ends, what
    was written there replaces ``path``. When the block or the rename raises, the temporary file is
    removed and ``path`` keeps what it held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_native_id()}.tmp")
    try:
        yield tmp
        if durable:
            _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:  # the new name itself survives a power loss
        _fsync(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
