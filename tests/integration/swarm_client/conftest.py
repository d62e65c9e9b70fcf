"""Client tests run against real ``swarm serve --model tiny`` subprocesses on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import ServeProcess, free_port

from swarm.client import SwarmClient


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One server shared by the client tests (starting one costs seconds on a busy machine)."""
    proc = ServeProcess(port=free_port(), state_dir=tmp_path_factory.mktemp("serve"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def client(server: ServeProcess) -> Iterator[SwarmClient]:
    with SwarmClient(server.url, token=server.token, retry_for_s=10) as c:
        yield c


@pytest.fixture
def new_server(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Start dedicated servers (for tests that crash or reconfigure them); all stopped at the end."""
    started: list[ServeProcess] = []

    def start(config: Path | None = None, port: int | None = None, state_dir: Path | None = None) -> ServeProcess:
        proc = ServeProcess(port=port or free_port(), state_dir=state_dir or tmp_path / f"serve{len(started)}",
                            config=config)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()
