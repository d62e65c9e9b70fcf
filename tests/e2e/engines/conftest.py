"""Engine tests run the real engines on the tiny preset: ``swarm serve --engine vllm`` / ``--trainer verl``
processes, the vLLM child and the verl trainer in process (``tiny_dir``: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """As in the backend unit tests: the tiny model is faster on one thread, and on a busy shared machine
    two spinning OpenMP threads can be many times slower; restore the caller's setting afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
