"""Folders written whole or not at all: checkpoints, published weights, the built tiny preset.

A reader (a restarting server, a vLLM reload) must never see half a folder, so every writer fills a
hidden staging folder beside the target and renames it into place in one ``rename``.

Durability is a separate choice. The rename alone survives the death of the process (the kernel
keeps what it wrote), which is all a weight publication needs: it is rewritten every step and read
at once, and an fsync per step cost more than the reload itself on a busy disk. A checkpoint is what
a restart after a power loss or an OS crash resumes from, so ``CheckpointManager.save`` calls
``fsync_tree`` on the whole checkpoint (whatever the trainer wrote into it, through ``atomic_folder``
or not) before its rename and ``fsync_dir`` on the root after it: the new name never points at data
the disk does not hold yet (about 20-80 ms for the tiny model's 5 MB checkpoint).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_folder", "build_once", "fsync_dir", "fsync_tree"]


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield a staging path beside ``target`` (not yet created: the caller makes it); when the block
    ends without an error it replaces ``target`` (an older folder there is moved aside, then removed).
    On an error, or a kill before the rename, only a hidden ``.<name>.staging-*`` folder is left.
    Nothing is fsynced (see the module docstring)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def build_once(folder: Path, is_current: Callable[[Path], bool], build: Callable[[Path], object]) -> Path:
    """``folder``, built by ``build(staging)`` unless ``is_current(folder)`` already holds. The build runs
    under a file lock beside the folder (processes starting side by side build once: the others wait,
    then find it current) and through ``atomic_folder`` (a killed or failed build leaves nothing a
    reader would take; a stale folder is replaced whole). ``build`` writes its marker last."""
    if is_current(folder):
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{folder.name}.lock")):
        if not is_current(folder):
            with atomic_folder(folder) as staging:
                build(staging)
    return folder


def fsync_tree(root: str | Path) -> None:
    """fsync every regular file under ``root``, then every folder bottom-up (a new file's name is only
    durable once the folder holding it is synced). Symlinks are not followed."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder, making the names created, renamed or removed in it durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
