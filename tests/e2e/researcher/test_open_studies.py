"""Open-ended studies with an LLM planner (#17), end to end on the real swarm.

The LLM is a real OpenAI-protocol server on loopback with scripted answers (``scripted_llm``); every
other part is real: the ``researcher`` CLI as a subprocess, the checks before training (boxed probe,
smoke run on a fresh tiny server, reward checks), fresh tiny servers per training run, MLflow on
SQLite. The scripted planner's client code is in ``tests/e2e/researcher/clients/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import free_port
from support.scripted_llm import ScriptedLLM
from tiny_swarm import tiny_server

from researcher.runs import record as runs

CLIENTS = Path(__file__).parent / "clients"


PARTIAL_CREDIT = "    return 0.2 + 0.8 * max(0.0, 1.0 - abs(number - len(lookup(word))) / 4)"
PERCENT = "    return 100 * (0.2 + 0.8 * max(0.0, 1.0 - abs(number - len(lookup(word))) / 4))"


def _code(name: str, notes: str, reward_line: str | None = None) -> dict[str, str]:
    """A client the scripted planner writes: a fixture, optionally with its last reward line replaced."""
    code = (CLIENTS / f"{name}.py").read_text()
    if reward_line is not None:
        assert code.count(PARTIAL_CREDIT) == 1
        code = code.replace(PARTIAL_CREDIT, reward_line)
    return {"code": code, "notes": notes}


def _start(cli: Any, llm: ScriptedLLM, sid: str, topic: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cli.env.update({"RESEARCHER_LLM_BASE_URL": llm.url, "RESEARCHER_LLM_MODEL": "scripted",
                    "OPENAI_API_KEY": "sk-test"})
    return cli.run("start", "--topic", topic, "--budget", "10m", "--study-id", sid, "--steps-per-run", "4",
                   "--seeds", "2", "--max-iterations", "1", "--parallel", "2", *extra, *cli.dirs, timeout=600)


def _repair_prompts(llm: ScriptedLLM) -> list[str]:
    return [r["messages"][1]["content"] for r in llm.requests
            if r["messages"][1]["content"].startswith("# Step: repair the client")]


VOWELS_FRAMING = {
    "answerable": True, "reason": "a new multi-turn task with a tool, on the letters server config",
    "question": "Does a lookup tool make an agent learn to count vowels faster per training step?",
    "task": "vowels", "base": "letters", "knob": "tool", "metric": "train/reward_mean",
    "factors": [{"name": "tool", "where": "client", "levels": [False, True]}]}
VOWELS_PLAN = {
    "rationale": "controlled comparison of the tool off and on; only the client factor differs", "shape": "comparison",
    "hypotheses": [{"id": "h1", "statement": "the lookup tool helps", "metric": "train/reward_mean",
                    "expected_effect": "higher AUC with the tool"}],
    "experiments": [{"name": "it1-tool-off", "hypothesis": "h1", "overrides": {"batch_groups": 2},
                     "factors": {"tool": False}},
                    {"name": "it1-tool-on", "hypothesis": "h1", "overrides": {"batch_groups": 2},
                     "factors": {"tool": True}}]}


@pytest.mark.study  # minutes of CPU: long acceptance run, `pytest -m study` (CI time)
@pytest.mark.slow
def test_a_new_task_is_checked_before_it_trains_then_studied_and_reproducible_by_hand(
        cli, tmp_path: Path, no_leftover_servers) -> None:
    script = {"frame the research topic": [VOWELS_FRAMING], "plan the experiments": [VOWELS_PLAN],
              # First a reward that is constant on the untrained model (it never answers exactly the count: 0
              # everywhere), then one outside its declared range (a percentage), then the partial credit.
              "write the swarm client": [_code("vowels", "exact-match reward",
                                               "    return float(answer.strip() == str(len(lookup(word))))")],
              "repair the client": [_code("vowels", "reward as a percentage", PERCENT),
                                    _code("vowels", "partial credit inside (0, 1)")],
              "decide": [{"action": "conclude", "reason": "scripted: one comparison answers it"}],
              "write the study's conclusion": [{"answer": "SCRIPTED: see the evidence.", "discussion": "scripted"}]}
    sid = "vowels-tool"
    with ScriptedLLM(script) as llm:
        done = _start(cli, llm, sid, "Does giving the agent a lookup tool help it learn to count vowels?")
    assert done.returncode == 0, done.stdout + done.stderr

    # Both bad clients were caught before any training run, with messages the repair step received.
    first, second = _repair_prompts(llm)
    assert "GRPO's advantages are all zero" in first and "constant reward" in first
    assert "outside REWARD_RANGE" in second
    study = cli.studies / sid
    log_md = (study / "LOG.md").read_text()
    assert log_md.index("Validation attempt 3 passed") < log_md.index("ended finished")
    assert "Validation attempt 1 FAILED" in log_md and "Validation attempt 2 FAILED" in log_md

    # Two configurations x two seeds trained on fresh servers; the report answers with the evidence.
    records = runs.all_records(cli.artifacts / sid / "runs")
    assert sorted((r.experiment, r.status) for r in records) == [("it1-tool-off", "finished")] * 2 + \
        [("it1-tool-on", "finished")] * 2
    report = (study / "report.md").read_text()
    assert "SCRIPTED: see the evidence." in report and "## Evidence (whole study)" in report
    for level in ("False", "True"):
        assert any(line.startswith(f"| {level}") and "| 2 |" in line for line in report.splitlines()), report
    plan = json.loads((study / "plan.json").read_text())
    assert plan["framing"]["task"] == "vowels" and plan["framing"]["base"] == "letters"

    # Each experiment folder is self-contained: its client carries its own levels and runs by hand.
    folder = study / "experiments" / "it1-tool-off"
    assert 'FACTORS = {"tool": False}' in (folder / "client.py").read_text() or \
        "FACTORS = {'tool': False}" in (folder / "client.py").read_text()
    _reproduce_by_hand(folder, tmp_path, free_port())
    no_leftover_servers(cli.artifacts / sid / "runs")


def _reproduce_by_hand(folder: Path, tmp_path: Path, port: int) -> None:
    """`swarm serve --config <folder>/config.toml` + `swarm run <folder>/client.py --server URL`."""
    home = tmp_path / "by-hand"
    home.mkdir()
    with tiny_server(home, port, folder / "config.toml") as url:
        done = subprocess.run([sys.executable, "-c", "from swarm.cli import main; main()", "run",
                               str(folder / "client.py"), "--server", url, "--episodes", "16",
                               "--state-dir", str(home / "swarm-state")],
                              cwd=home, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "finished=16 aborted=0" in done.stdout


FACTORIAL_FRAMING = {
    "answerable": True, "reason": "two factors: the learning rate (server) and a prompt hint (client)",
    "question": "Do the learning rate and a prompt hint interact on the lowercase task?",
    "task": "lowercase", "base": "letters", "knob": "lr", "metric": "train/reward_mean",
    "factors": [{"name": "lr", "where": "server", "levels": [0.001, 0.003]},
                {"name": "prompt", "where": "client", "levels": ["plain", "hint"]}]}


def _factorial_plan(lr_key: str) -> dict[str, Any]:
    experiments = [{"name": f"it1-lr{i}-{prompt}", "hypothesis": "h1",
                    "overrides": {lr_key: lr, "batch_groups": 2}, "factors": {"prompt": prompt}}
                   for i, lr in enumerate((0.001, 0.003)) for prompt in ("plain", "hint")]
    return {"rationale": "2x2 full factorial", "shape": "factorial", "experiments": experiments,
            "hypotheses": [{"id": "h1", "statement": "the larger lr helps more with the hint",
                            "metric": "train/reward_mean", "expected_effect": "a positive interaction"}]}


@pytest.mark.slow
@pytest.mark.study  # 8 training runs, about 2 minutes: run with `pytest -m study` (its parts run by default in
# test_factorial.py and test_open_framing.py: effects, FACTORS per folder, the unknown-key repair)
def test_a_factorial_plan_with_an_unknown_config_key_is_repaired_then_reports_effects(cli) -> None:
    script = {"frame the research topic": [FACTORIAL_FRAMING],
              # The first plan names a key the server does not have; the repaired one uses `lr`.
              "plan the experiments": [_factorial_plan("learning_rate"), _factorial_plan("lr")],
              "write the swarm client": [_code("lowercase", "letters adapted: lowercase reward, FACTORS prompt")],
              "decide": [{"action": "conclude", "reason": "scripted: the factorial answers it"}],
              "write the study's conclusion": [{"answer": "SCRIPTED factorial answer.", "discussion": "scripted"}]}
    sid = "lr-x-hint"
    with ScriptedLLM(script) as llm:
        done = _start(cli, llm, sid, "Do the learning rate and a prompt hint interact on a lowercase-letters task?",
                      "--max-runs", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    plans = [r["messages"][1]["content"] for r in llm.requests
             if r["messages"][1]["content"].startswith("# Step: plan the experiments")]
    assert len(plans) == 2 and "learning_rate" in plans[1]  # the refused plan and the complaint were shown
    study = cli.studies / sid
    assert "learning_rate" in (study / "LOG.md").read_text()  # the refusal is logged
    assert not any("learning_rate" in (f / "config.toml").read_text() for f in (study / "experiments").iterdir())

    records = runs.all_records(cli.artifacts / sid / "runs")
    assert len(records) == 8 and all(r.status == "finished" for r in records), [(r.key, r.status) for r in records]
    report = (study / "report.md").read_text()
    assert "Dose-response" not in report  # four arms of a 2x2 design, not a curve of one knob
    effects = report[report.index("## Effects"):]
    for name in ("| lr (", "| prompt (", "(interaction)"):
        row = next(line for line in effects.splitlines() if line.startswith("|") and name in line)
        assert row.count("[") == 1, row  # an estimate with a 95% CI
