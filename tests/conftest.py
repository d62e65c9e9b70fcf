"""Test-wide environment: offline, no telemetry (the shared helpers are in ``support``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import parallel
from support.ray_logs import dead_worker_pids, oom_kills, worker_post_mortem

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Registry models (smollm2-135m) are converted once per checkout, not into the user's ~/.cache.
os.environ.setdefault("SWARM_MODEL_CACHE", str(Path(__file__).resolve().parents[1] / "artifacts" / "model-cache"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``tiny`` preset's folder, built once per session (the backend unit tests and the engine tests)."""
    from swarm.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny-0", seed=0)


@pytest.fixture(scope="session")
def bpe_model(tmp_path_factory: pytest.TempPathFactory):
    """The ``tiny-bpe`` preset (Qwen's real BPE on a tiny random model), built once per session."""
    from swarm.models.resolve import resolve_model_folder

    return resolve_model_folder("tiny-bpe", seed=0, cache_dir=tmp_path_factory.mktemp("models") / "tiny-bpe-0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that failed on a dead Ray worker reports what that worker and raylet logged: the
    exception alone says only that the process went away."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "ActorDiedError" in report.longreprtext:
        for pid in dead_worker_pids(report.longreprtext):
            report.sections.append((f"Ray worker {pid}", worker_post_mortem(pid) or "(no log of this pid)"))
        report.sections.append(("OOM killer", f"processes killed by the kernel's OOM killer since boot: {oom_kills()}"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n``: the long groups first (``support.parallel``). The sort is stable, so every worker
    collects the same order, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: parallel.rank(item.nodeid))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (-p no:xdist) skips it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``-n``: each group of ``support.parallel`` goes to one worker whole. A scheduler of our own
    rather than ``xdist_group`` marks: xdist 3.8 groups by a suffix it writes into ``item._nodeid``,
    which pytest 9 no longer reads, so under pytest 9 the marks split modules (and Ray's group) across
    workers without a word."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return parallel.group(nodeid)

    return GroupScheduling(config, log)
