"""Test-wide environment: offline, no telemetry (the shared helpers are in ``support``)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bpe_model(tmp_path_factory: pytest.TempPathFactory):
    """The ``tiny-bpe`` preset (Qwen's real BPE on a tiny random model), built once per session."""
    from swarm.backends.torch import resolve_model_folder

    return resolve_model_folder("tiny-bpe", seed=0, cache_dir=tmp_path_factory.mktemp("models") / "tiny-bpe-0")
