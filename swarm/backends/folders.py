"""Folders written whole or not at all: checkpoints, published weights, the built tiny preset.

A reader (a restarting server, a vLLM reload) must never see half a folder, so every writer fills a
hidden staging folder beside the target and renames it into place in one ``rename``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_folder"]


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield a staging path beside ``target`` (not yet created: the caller makes it); when the block
    ends without an error it replaces ``target`` (an older folder there is moved aside, then removed).
    On an error, or a kill before the rename, only a hidden ``.<name>.staging-*`` folder is left."""
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
