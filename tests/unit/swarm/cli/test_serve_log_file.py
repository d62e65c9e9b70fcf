"""``swarm serve --log-file``: the log goes to a rotated file that never passes ``(keep + 1) x max``
bytes, and stderr keeps warnings and errors only."""

from __future__ import annotations

import logging
from pathlib import Path

from swarm.cli.serve import log_to_file


def test_the_log_file_rotates_within_its_cap(tmp_path: Path) -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    stderr = logging.StreamHandler()
    root.handlers[:] = [stderr]
    root.setLevel(logging.INFO)
    try:
        log_to_file(tmp_path / "logs" / "server.log", max_bytes=4096, keep=2)
        for n in range(2000):
            logging.getLogger("swarm.test").info("step %d: a line that repeats for a while", n)
        files = sorted(p.name for p in (tmp_path / "logs").iterdir())
        assert files == ["server.log", "server.log.1", "server.log.2"]
        assert sum(p.stat().st_size for p in (tmp_path / "logs").iterdir()) <= 3 * 4096
        assert "step 1999:" in (tmp_path / "logs" / "server.log").read_text()
        assert stderr.level == logging.WARNING  # the terminal keeps what needs a person
    finally:
        for handler in root.handlers:
            if handler not in before:
                handler.close()
        root.handlers[:] = before
        root.setLevel(level)
