"""The researcher runs experiments on other engines: `engine = "vllm"` and `trainer = "verl"` are config
keys an experiment's config.toml sets, and the offline planner offers both as knobs.

Real everything: `researcher start` as a process, real `swarm serve` runs (one with a vLLM child, one
with a verl worker group on Ray), MLflow on SQLite. Each study compares the embedded torch engine with
the other one, one seed each, a few steps: it shows the wiring, not a learning result.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from researcher.runs import record as runs


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.study  # about 140 s a case on 2 cores; the config-file path they take is every knob's (CI time, #51)
@pytest.mark.parametrize(("topic", "key", "other", "server_says"), [
    ("Does vLLM rollout change learning on the letters task?", "engine", "vllm", "vLLM up at"),
    ("Does training on verl change learning on the letters task?", "trainer", "verl", "verl trainer: 1 FSDP2 worker"),
])
def test_study_runs_an_experiment_on_another_engine(cli, tmp_path: Path, no_leftover_servers: Callable[[Path], None],
                                                    topic: str, key: str, other: str, server_says: str) -> None:
    sid = f"engine-{key}"
    done = cli.run("start", "--topic", topic, "--budget", "12m", "--study-id", sid, "--steps-per-run", "3",
                   "--seeds", "1", "--max-runs", "2", "--max-iterations", "1", *cli.dirs, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    runs_dir = cli.artifacts / sid / "runs"
    records = runs.all_records(runs_dir)
    assert sorted(r.config.get(key, "torch") for r in records) == sorted(["torch", other])
    assert {r.status for r in records} == {"finished"} and all(r.last_step >= 3 for r in records)
    for record in records:
        run_dir = runs_dir / f"{record.iteration:02d}-{record.trial:02d}"
        config = tomllib.loads(Path(record.client).with_name("config.toml").read_text())
        server_log = (run_dir / "server.log").read_text(errors="replace")
        if record.config.get(key) == other:
            assert config[key] == other  # what `swarm serve --config` read
            assert server_log.count(server_says) >= 1, server_log[-2000:]
        else:
            assert server_says not in server_log
    no_leftover_servers(runs_dir)
    status = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
    assert status["state"] == "done"
