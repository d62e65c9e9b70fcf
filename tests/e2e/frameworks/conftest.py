"""The frameworks tier: ten agent frameworks, each unchanged but for ``base_url``, ``api_key`` and the model
name, against a real ``swarm serve`` (``agent_run``). Each module shares one server among its agents."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_run import PYTHON, serve
from support import ServeProcess

LONG_CONTEXT = 8192


@pytest.fixture(scope="session")
def frameworks_python() -> Path:
    """The frameworks' interpreter; a test fails (never skips) without it: ``.ci/setup-all`` builds it."""
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run .ci/setup-frameworks (.ci/setup-all builds it)")
    return PYTHON


@pytest.fixture(scope="session")
def tiny_8k(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``tiny`` preset's folder with its context raised from 2,048 to 8,192 positions, for the agents
    whose conversations outgrow 2,048 bytes (tiny's tokens are bytes): smolagents' system prompt alone is
    4,204. Only the limit changes (``max_position_embeddings`` and the tokenizer's ``model_max_length``):
    tiny's positions are rotary, so its weights take any length."""
    folder = tmp_path_factory.mktemp("models") / "tiny-8k"
    shutil.copytree(tiny_dir, folder)
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        settings = json.loads((folder / name).read_text())
        settings[key] = LONG_CONTEXT
        (folder / name).write_text(json.dumps(settings, indent=2))
    return folder


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``swarm serve --model tiny --served-model-name gpt-4o-mini``, shared by a module's agents."""
    server = serve(tmp_path_factory.mktemp("serve-tiny"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def long_server(tiny_8k: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The same on ``tiny_8k``, shared by a module's agents."""
    server = serve(tmp_path_factory.mktemp("serve-tiny-8k"), str(tiny_8k))
    yield server
    server.stop()
