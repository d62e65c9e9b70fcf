"""``swarm run --data`` against a real ``swarm serve --model tiny``: bad files stop before any
episode is claimed (exit 2, file, row and reason), the arith example trains with held-out
evaluation, and a saved model folder serves as ``--model PATH``. The reward-rise acceptance run is
``-m study``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import ServeProcess, free_port

ROOT = Path(__file__).resolve().parents[3]
ARITH = ROOT / "studies" / "examples" / "arith"
SWARM = [sys.executable, "-m", "swarm.cli"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    proc = ServeProcess(port=free_port(), state_dir=tmp_path_factory.mktemp("serve"), config=ARITH / "config.toml")
    proc.start()
    yield proc
    proc.stop()


def swarm_run(server: ServeProcess, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SWARM, "run", "--server", server.url, "--state-dir", str(server.state_dir), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def claimed(server: ServeProcess) -> int:
    status = httpx.get(f"{server.url}/api/v1/status", headers={"Authorization": f"Bearer {server.token}"}).json()
    return int(status["episodes"]["claimed"])  # not a sum over states: ``trained`` grows as training catches up


def test_bad_files_stop_before_any_episode_is_claimed(server: ServeProcess, tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+1?", "answer": str(i + 1)} for i in range(60)]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("".join(json.dumps(r) + "\n" if i != 56 else json.dumps(r)[:-3] + "\n" for i, r in enumerate(rows)))
    noprompt = tmp_path / "noprompt.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1", "answer": "2"}]), noprompt)
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text("def score(text, row):\n    if row['ground_truth'] == '3':\n"
                                        "        raise RuntimeError('cannot score')\n    return 0.0\n")
    before = claimed(server)
    cases = [(["--data", str(broken), "--reward", "exact"], f"{broken}: line 57: not valid JSON"),
             (["--data", str(noprompt)], f"{noprompt}: no 'prompt' column"),
             (["--data", str(good), "--reward", f"{tmp_path / 'reward.py'}:score"],
              f"{good}: line 3: the reward raised RuntimeError: cannot score")]
    for args, message in cases:
        done = swarm_run(server, *args)
        assert done.returncode == 2, done.stderr
        assert message in " ".join(done.stderr.split()), done.stderr
    assert claimed(server) == before  # nothing started


def test_arith_data_trains_with_heldout_evaluation(server: ServeProcess) -> None:
    done = swarm_run(server, "--data", str(ARITH / "train.parquet"), "--heldout", str(ARITH / "test.parquet"),
                     "--warmup-steps", "20", "--episodes", "96", "--eval-every", "2", "--heldout-size", "16",
                     "--eval-samples", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished=96" in done.stdout
    steps = httpx.get(f"{server.url}/api/v1/metrics", headers={"Authorization": f"Bearer {server.token}"}).json()
    rounds = [s["metrics"] for s in steps if "eval/reward_mean" in s["metrics"]]
    assert rounds and all(0.0 <= m["eval/reward_mean"] <= 1.0 for m in rounds)
    # Each of the 16 held-out problems twice a round, each sample its own noise: the round's sampling sd.
    assert all(m["eval/episodes"] == 32 and 0.0 <= m["eval/reward_mean_sd"] <= 0.5 for m in rounds)


def test_a_saved_model_folder_serves_as_model_path(tmp_path: Path) -> None:
    from swarm.models.presets import build_preset

    folder = build_preset("tiny", tmp_path / "my-model")
    proc = ServeProcess(port=free_port(), state_dir=tmp_path / "state", model=str(folder)).start()
    try:
        models = httpx.get(f"{proc.url}/v1/models", headers={"Authorization": f"Bearer {proc.token}"}).json()
        assert models["data"]
    finally:
        proc.stop()


@pytest.mark.study
def test_arith_heldout_reward_rises(tmp_path: Path) -> None:
    """Acceptance: warm-up 150 steps, then 100 GRPO steps; the mean of the last three held-out rounds
    beats step 0's by at least 0.03 (measured: 0.078 -> 0.14, seed 0)."""
    proc = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=ARITH / "config.toml").start()
    try:
        done = swarm_run(proc, "--data", str(ARITH / "train.parquet"), "--heldout", str(ARITH / "test.parquet"),
                         "--warmup-steps", "150", "--episodes", "3200", "--eval-every", "10", timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        steps = httpx.get(f"{proc.url}/api/v1/metrics", headers={"Authorization": f"Bearer {proc.token}"}).json()
    finally:
        proc.stop()
    evals = [s["metrics"]["eval/reward_mean"] for s in steps if "eval/reward_mean" in s["metrics"]]
    assert len(evals) >= 5
    assert sum(evals[-3:]) / 3 >= evals[0] + 0.03, evals
