"""How long a run's server may take to start: a vLLM child or a verl worker group on Ray gets minutes
(a soak's vLLM runs on a busy 2-core machine crashed at the 120 s that suits the torch engine)."""

from __future__ import annotations

import pytest

from researcher.runs.processes import SLOW_START_S, RunProcesses
from researcher.runs.record import RunRecord


def _record(**config: object) -> RunRecord:
    return RunRecord(key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=0, config=config,
                     client="client.py", target_step=3, episodes=10, group_size=2)


@pytest.mark.parametrize(("config", "expected"), [
    ({}, 120.0),
    ({"engine": "torch", "lr": 1e-3}, 120.0),
    ({"engine": "vllm"}, SLOW_START_S),
    ({"trainer": "verl"}, SLOW_START_S),
])
def test_a_vllm_or_verl_run_gets_minutes_to_start(config: dict[str, object], expected: float) -> None:
    assert RunProcesses(["swarm"]).ready_timeout_for(_record(**config)) == expected


def test_a_longer_setting_is_kept_for_every_run() -> None:
    processes = RunProcesses(["swarm"], ready_timeout_s=900.0)
    assert processes.ready_timeout_for(_record(engine="vllm")) == 900.0
    assert processes.ready_timeout_for(_record()) == 900.0
