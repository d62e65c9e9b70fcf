"""Study tests start real ``swarm serve`` processes with the launcher the client tests use."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swarm" / "client"))
from swarm_proc import ServeProcess  # noqa: E402


@pytest.fixture
def new_server(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(config: Path | None = None, extra_args: tuple[str, ...] = (), timeout_s: float = 90.0,
              model: str | None = "tiny") -> ServeProcess:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = ServeProcess(port=port, state_dir=tmp_path / f"serve{len(started)}", config=config,
                            extra_args=extra_args, model=model)
        started.append(proc)
        return proc.start(timeout_s)

    yield start
    for proc in started:
        proc.stop()
