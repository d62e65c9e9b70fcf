"""Fixtures for the server tests: the tiny model built once per session, servers stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import RunningServer, launch
from taught_tools import teach_tools


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from swarm.models.tiny import build_tiny

    # One intra-op thread: the tiny model gains nothing from two, and on a shared 2-core machine
    # two spinning threads made each training step 20x slower (measured: 1.7 s vs 0.08 s).
    torch.set_num_threads(1)

    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tool_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model taught one tool loop (``taught_tools``), shared by the chat and Responses tests."""
    return teach_tools(tiny_model, tmp_path_factory.mktemp("warm-tools"))


@pytest.fixture
def start_server(tiny_model: Path, tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    servers: list[RunningServer] = []

    def start(**kwargs: Any) -> RunningServer:
        state_dir = kwargs.pop("state_dir", tmp_path / f"state{len(servers)}")
        model_dir = kwargs.pop("model_dir", tiny_model)
        running = launch(model_dir, state_dir, **kwargs)
        servers.append(running)
        return running

    yield start
    for running in servers:
        running.stop()
