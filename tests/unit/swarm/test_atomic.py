"""``swarm.atomic``: a file is written whole or keeps what it held, and no temporary file outlives a write."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from swarm.atomic import replacing, write_atomic


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_write_replaces_the_file_whole_and_creates_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "server.json"
    write_atomic(target, '{"port": 1}')
    write_atomic(target, '{"port": 2}', durable=True)
    write_atomic(target.with_name("blob.bin"), b"\x00\xff")
    assert target.read_text() == '{"port": 2}' and target.with_name("blob.bin").read_bytes() == b"\x00\xff"
    assert _left(target.parent) == ["blob.bin", "server.json"]  # no temporary file left


def test_a_block_that_raises_leaves_the_old_content_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "episodes.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="the writer failed"), replacing(target, durable=True) as tmp:
        tmp.write_text("half of the new")
        assert tmp.parent == tmp_path and tmp.name.startswith(".episodes.jsonl.") and tmp.name.endswith(".tmp")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old\n" and _left(tmp_path) == ["episodes.jsonl"]


def test_a_write_the_disk_refuses_leaves_the_old_content_and_no_temporary_file(tmp_path: Path) -> None:
    """A file-size limit refuses the write half-way (EFBIG, as ENOSPC would): in a child process, so the
    limit binds nothing else."""
    target = tmp_path / "run.json"
    write_atomic(target, "kept")
    code = ("import resource, signal, sys; from pathlib import Path; from swarm.atomic import write_atomic\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n    write_atomic(Path(sys.argv[1]), 'x' * 100_000)\nexcept OSError as exc:\n    print(exc.errno)")
    out = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == str(errno.EFBIG), out.stderr
    assert target.read_text() == "kept" and _left(tmp_path) == ["run.json"]


def test_concurrent_writers_of_one_path_never_mix_their_contents(tmp_path: Path) -> None:
    """Each thread writes its own temporary file: whatever wins, the file holds one writer's text whole."""
    target = tmp_path / "cursor.json"
    texts = [str(n) * 200_000 for n in range(4)]
    errors: list[BaseException] = []

    def write(text: str) -> None:
        try:
            for _ in range(20):
                write_atomic(target, text)
        except BaseException as exc:  # surfaced below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and target.read_text() in texts and _left(tmp_path) == ["cursor.json"]
