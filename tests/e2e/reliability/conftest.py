"""Fixtures for the reliability tests: the tiny model built once, real server processes cleaned up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ServeProcess


@pytest.fixture(scope="session")
def rel_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from swarm.models.tiny import build_tiny

    torch.set_num_threads(1)
    return build_tiny(tmp_path_factory.mktemp("rel-tiny") / "model", seed=0)


@pytest.fixture
def servers() -> Iterator[list[ServeProcess]]:
    """Server processes a test starts; every one still alive is killed when the test ends."""
    started: list[ServeProcess] = []
    yield started
    for server in started:
        server.kill()
