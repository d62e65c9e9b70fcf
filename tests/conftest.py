"""Test-wide environment: offline, no telemetry (the shared helpers are in ``support``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
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


# Parallel runs (README's test command: ``pytest -n 2 --dist loadgroup``). Each module goes to one worker
# whole, so its module-scoped fixtures (servers, model builds, the vLLM child) are built once. The
# modules that start a local Ray cluster share one group: they then run one after another on one
# worker, as two Ray heads on one machine would compete for its cores and ports. Groups are handed out
# longest first (Ray's group, then the studies the researcher runs end to end, then the rest) so both
# workers finish together rather than one waiting on a late long module.
RAY_MODULES = {
    "tests/swarm/backends/test_verl_trainer.py",
    "tests/swarm/engines/test_verl_server.py",
    "tests/swarm/engines/test_real_model.py",
    "tests/researcher/test_ray_placement.py",
    "tests/researcher/test_engines.py",
    "tests/studies/test_letters.py",
}
LONG_FIRST = ("ray", "tests/researcher/", "tests/studies/", "tests/soak/")


def _group(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0]
    return "ray" if module in RAY_MODULES else module


def _rank(item: pytest.Item) -> int:
    group = _group(item)
    return next((i for i, prefix in enumerate(LONG_FIRST) if group.startswith(prefix)), len(LONG_FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``-n``: mark each test with its group and put the long groups first (a stable sort, so
    every worker collects the same order, which xdist requires)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    items.sort(key=_rank)
