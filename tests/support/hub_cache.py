"""A real Hugging Face hub cache laid out offline, for tests of ``--model org/name[@revision]``.

huggingface_hub's documented cache layout (https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
``models--ORG--NAME/blobs/<content hash>`` holds each file once, ``snapshots/<40-hex commit>/<file>``
are relative symlinks into ``blobs``, and ``refs/<revision>`` holds the commit a branch or tag names.
The blobs here are symlinks to a local model folder's files (the converted SmolLM2 folder is 538 MB:
linked, not copied), named by their content's sha256, as the Hub names LFS files.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from swarm.models.gguf import file_sha256


def fake_commit(label: str) -> str:
    """A 40-hex commit id, the same for the same label."""
    return hashlib.sha1(label.encode()).hexdigest()


def add_snapshot(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ()) -> Path:
    """Put ``source``'s files into ``cache`` as ``repo_id`` at ``commit``, with each of ``refs`` (branch
    or tag names) pointing at it; the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        blob = repo / "blobs" / _sha256(file)
        if not blob.is_symlink():
            blob.symlink_to(file.resolve())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


_sha256 = functools.cache(file_sha256)  # a second snapshot of the same files hashes nothing again
