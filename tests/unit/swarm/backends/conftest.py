"""Fixtures for the torch backend tests: a fresh backend on the session's tiny model folder (``tiny_dir``,
tests/conftest.py), on one torch thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.backends.base import TrainConfig


@pytest.fixture
def backend(tiny_dir: Path, request: pytest.FixtureRequest):
    """A fresh backend on the tiny folder (new weights copy, no optimizer state). A module can run its
    tests on both decoding caches (the growing ``running`` cache and the static ``slots`` cache, a
    GPU's default) with ``pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)``."""
    from swarm.backends.torch import TorchBackend

    decode_cache = getattr(request, "param", "dynamic")
    return TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache=decode_cache)



@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model is faster on one thread, and on a busy shared machine two spinning OpenMP
    threads can be many times slower; restore the caller's setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
