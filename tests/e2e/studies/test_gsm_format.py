"""The gsm-format example: SmolLM2-135M-Instruct, a real pretrained model, learns to end its answer with
``#### <n>`` under GRPO (``-m study``: about half an hour on 2 CPU cores).

Acceptance (issue #34): on the 32 held-out problems, evaluated at the training temperature (1.0), the
mean of the last three eval rounds gains at least 0.08 over step 0's reward within 30 steps. The same
holds with LoRA (``lora.toml``: rank 16, lr 1e-4; issue #50).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support import ROOT, SWARM, ManagedProcess, ServeProcess, free_port, wait_for

pytestmark = [pytest.mark.study, pytest.mark.timeout(9600)]

EXAMPLE = ROOT / "studies" / "examples" / "gsm-format"
STEPS, EVAL_EVERY = 30, 5


def _evals(server: ServeProcess) -> dict[int, float]:
    steps = httpx.get(f"{server.url}/api/v1/metrics", headers={"Authorization": f"Bearer {server.token}"},
                      timeout=60).json()
    return {int(s["metrics"]["eval/step"]): s["metrics"]["eval/reward_mean"] for s in steps
            if "eval/reward_mean" in s["metrics"]}


@pytest.mark.parametrize("config", ["config.toml", "lora.toml"])
def test_smollm2_learns_the_answer_format(tmp_path: Path, config: str) -> None:
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=EXAMPLE / config, model=None,
                          extra_args=("--max-steps", str(STEPS))).start(600)
    client = ManagedProcess(tmp_path / "run.log")
    try:
        client.launch([*SWARM, "run", "--server", server.url, "--state-dir", str(server.state_dir),
                       "--data", str(EXAMPLE / "train.jsonl"), "--heldout", str(EXAMPLE / "test.jsonl"),
                       "--reward", f"{EXAMPLE / 'reward.py'}:score", "--eval-every", str(EVAL_EVERY),
                       "--concurrency", "16", "--episodes", "100000"])
        wait_for(lambda: STEPS in _evals(server), 9000, what=f"the held-out round of step {STEPS}", interval=10)
        evals = _evals(server)
    finally:
        client.stop()
        server.stop()
    print(f"held-out reward by step ({config}): {dict(sorted(evals.items()))}")
    rounds = [evals[s] for s in sorted(evals)]
    assert len(rounds) == STEPS // EVAL_EVERY + 1, evals
    assert sum(rounds[-3:]) / 3 >= rounds[0] + 0.08, evals
