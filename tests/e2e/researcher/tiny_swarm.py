"""A real tiny swarm server for researcher tests: `swarm serve --model tiny` on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from support import ServeProcess


@contextlib.contextmanager
def tiny_server(folder: Path, port: int, config: Path, token: str | None = None) -> Iterator[str]:
    """A real `swarm serve --model tiny --config CONFIG` on loopback (state and log in ``folder``); its URL.

    Stopped (SIGTERM, then SIGKILL after 20 s) when the block ends."""
    server = ServeProcess(port=port, state_dir=folder / "swarm-state", config=config, given_token=token,
                          log_path=folder / "swarm-server.log", cwd=folder, extra_args=("--threads", "1"))
    server.start(120)
    try:
        yield server.url
    finally:
        server.stop(grace_s=20)
