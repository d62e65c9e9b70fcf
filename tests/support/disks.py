"""A small disk a test can fill: a tmpfs mounted for the test, and a filler that takes all its space.

Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the test is skipped, saying so.
``small_disk`` unmounts on the way out, also when the test failed.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill", "small_disk"]


@contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A ``size_mb`` tmpfs mounted at ``where`` (created) for the block; skips the test if mount is refused."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}M", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"filling a disk needs a small tmpfs, and mounting one is not permitted here: "
                    f"{mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)  # still open somewhere: detach it


def fill(disk: Path) -> Path:
    """Write a filler file until the disk refuses (ENOSPC): nothing is left free. Returns its path."""
    filler = disk / "filler"
    chunk = b"\0" * 2**20
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)  # a short write, then ENOSPC on the next
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler
