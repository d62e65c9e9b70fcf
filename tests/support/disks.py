"""A small disk a test can fill: a tmpfs mounted for the test, and a filler that takes all its space.

Mounting needs root (or CAP_SYS_ADMIN), which this machine and CI have: a refused mount fails the test.
``small_disk`` unmounts on the way out, also when the test failed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill", "small_disk"]


@contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A ``size_mb`` tmpfs mounted at ``where`` (created) for the block; fails the test if mount is refused."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}M", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"filling a disk needs a small tmpfs (run as root), and mounting one was refused: "
                    f"{mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)  # still open somewhere: detach it


def fill(disk: Path, name: str = "filler") -> Path:
    """Write a filler file until the disk refuses (ENOSPC): nothing is left free. Returns its path. Most
    of the space is taken in one ``posix_fallocate`` (tmpfs allocates without copying), the rest by writes."""
    filler = disk / name
    with open(filler, "wb", buffering=0) as out:
        with contextlib.suppress(OSError):
            os.posix_fallocate(out.fileno(), 0, max(shutil.disk_usage(disk).free - 2**20, 1))
        out.seek(0, os.SEEK_END)
        chunk = b"\0" * 2**20
        try:
            while True:
                out.write(chunk)  # a short write, then ENOSPC on the next
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler
