"""End to end: an unmodified verifiers 0.4 taskset (``studies/examples/verifiers/letters_v1``) trains
through one run key. ``vf-eval`` runs in ``.venv-verifiers`` (``.ci/setup-verifiers``: verifiers 0.4
pins openai<3, the test extra's Agents SDK needs openai>=3) against a real ``swarm serve`` process,
three times; after each, the example's 10-line ``rewards.py`` posts every rollout's reward by its
trace id, the ``X-Session-ID`` verifiers sent on its calls. Each run is one step of 4 episodes, one
merged sample each. Skipped, saying how to build it, where ``.venv-verifiers`` is absent."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support import ROOT, ServeProcess, wait_for

from swarm.client import SwarmClient

EXAMPLE = ROOT / "studies" / "examples" / "verifiers"
VENV = ROOT / ".venv-verifiers" / "bin"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (VENV / "vf-eval").exists(),
                                                   reason="no .venv-verifiers: run .ci/setup-verifiers")]


def _vf_eval(env: dict[str, str], out: Path, seed: int) -> None:
    args = ["letters-v1", "-n", "2", "-r", "2", "--model", "tiny", "--client.base-url", f"{env['SWARM_URL']}/v1",
            "--client.api-key-var", "SWARM_RUN_KEY", "--env.agent.harness.id", "null",
            "--env.agent.runtime.type", "subprocess", "--sampling.max-tokens", "16", "--env.taskset.seed", str(seed),
            "--output-dir", str(out), "--run.dir", f"r{seed}", "--no-push"]
    evaluated = subprocess.run([str(VENV / "vf-eval"), *args], cwd=out, env=env, capture_output=True, text=True,
                               timeout=180)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    traces = out / f"r{seed}" / "traces.jsonl"
    rewarded = subprocess.run([str(VENV / "python"), str(EXAMPLE / "rewards.py"), str(traces)], env=env,
                              capture_output=True, text=True, timeout=60)
    assert rewarded.returncode == 0, rewarded.stderr[-3000:]


def test_a_verifiers_taskset_trains_through_one_run_key(new_server: Callable[..., ServeProcess],
                                                        tmp_path: Path) -> None:
    server = new_server(config=EXAMPLE / "config.toml")
    client_token = (server.state_dir / "client_token").read_text().strip()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {client_token}"}) as http:
        key = http.post("/api/v1/runs", json={"run": "letters"}).json()["api_key"]
    env = {**os.environ, "SWARM_URL": server.url, "SWARM_RUN_KEY": key}
    env.pop("PYTHONPATH", None)  # the verifiers venv imports nothing of this repository
    with SwarmClient(server.url, token=server.token) as swarm:
        for seed in range(3):
            _vf_eval(env, tmp_path, seed)
            wait_for(lambda s=seed: swarm.status().step > s, timeout=60, what=f"the step of vf-eval run {seed}")
        rows = [m.metrics for m in swarm.metrics() if "train/episodes" in m.metrics]
        status = swarm.status()
    assert len(rows) == 3 and status.episodes.claimed == status.episodes.trained == 12
    assert all(r["train/episodes"] == 4 and r["context/samples_per_episode"] == 1.0 for r in rows)
