"""Study tests start real ``swarm serve`` processes with the shared harness (``support.ServeProcess``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import ServeProcess, free_port


@pytest.fixture
def new_server(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(config: Path | None = None, extra_args: tuple[str, ...] = (), timeout_s: float = 90.0,
              model: str | None = "tiny") -> ServeProcess:
        proc = ServeProcess(port=free_port(), state_dir=tmp_path / f"serve{len(started)}", config=config,
                            extra_args=extra_args, model=model)
        started.append(proc)
        return proc.start(timeout_s)

    yield start
    for proc in started:
        proc.stop()
