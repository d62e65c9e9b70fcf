"""Studies sized from their pilot, end to end (the real CLI, tiny swarm servers, MLflow on SQLite):

- a pilot whose spread says the budget cannot decide: the study says so before its next runs start, and
  the Answer repeats it;
- a 10-minute study on letters uses at least 80% of its budget, or ends settled and says so (``-m study``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest

from researcher.runs import record as runs

AA_TOPIC = "A/A check: do two identical configurations of letters learn at different speeds?"


def _answer(cli: Any, sid: str) -> str:
    return (cli.studies / sid / "report.md").read_text().split("## Answer\n\n", 1)[1].split("\n", 1)[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pilot_that_shows_the_budget_cannot_decide_says_so_before_the_next_runs(cli: Any) -> None:
    sid = "cannot-decide"
    # Two identical arms and a minimum effect of 0.001: resolving ±0.001 takes hundreds of seeds an arm.
    done = cli.run("start", "--topic", AA_TOPIC, "--budget", "4m", "--study-id", sid, "--steps-per-run", "6",
                   "--seeds", "2", "--parallel", "2", "--max-iterations", "2", "--min-effect", "0.001", *cli.dirs,
                   timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    plan = json.loads((cli.studies / sid / "plan.json").read_text())
    design = plan["design"]
    assert design["looks"] == 2 and design["pilot_seeds"] == 2 and design["reachable"] is False
    assert design["needed_seeds"] > design["max_seeds"], design
    sizing = design["sizing"]
    assert re.match(r"The budget cannot decide this: the pilot's spread \(paired difference sd [0-9.]+\) needs about "
                    r"\d+ seeds an arm to resolve ±0\.001 at 80% power, about [0-9.]+ (hours|minutes) here, and the "
                    r"budget runs only \d+\. The study runs what fits\.", sizing), sizing
    # Said as soon as it was known: in LOG.md after the pilot's analysis, before any run of a later look.
    log = (cli.studies / sid / "LOG.md").read_text()
    said = log.index(sizing)
    assert log.index("Iteration 1 analysed") < said and "Iteration 2 planned" not in log[:said]
    when = dt.datetime.fromisoformat(re.findall(r"\*\*([^*]+)\*\*", log[:said])[-1]).timestamp()
    later = [r for r in runs.all_records(cli.artifacts / sid / "runs") if r.iteration > 1]
    assert all(when <= r.started_at + 1 for r in later), (when, [r.started_at for r in later])
    assert "sized" in done.stdout and "The budget cannot decide this" in done.stdout  # on the terminal too
    answer = _answer(cli, sid)
    assert not answer.startswith(("Yes", "No:")) and answer.endswith(sizing), answer


@pytest.mark.slow
@pytest.mark.study  # ten minutes: run with `pytest -m study`
@pytest.mark.timeout(1200)
def test_a_ten_minute_letters_study_uses_its_budget_or_ends_settled(cli: Any, tmp_path: Path) -> None:
    sid = "ten-minutes"
    done = cli.run("start", "--topic", "Does a larger GRPO group size make the letters task learn faster?",
                   "--budget", "10m", "--study-id", sid, *cli.dirs, timeout=1100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    state = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
    records = runs.all_records(cli.artifacts / sid / "runs")
    started = min(r.started_at for r in records if r.started_at)
    ended = max(r.ended_at or 0.0 for r in records)
    used = (ended - started) / 600
    answer = _answer(cli, sid)
    settled = answer.startswith(("Yes", "No:", "No meaningful difference"))
    assert used >= 0.8 or (settled and "Settled at look" in answer), (used, answer, state)
    assert "per episode consumed" in answer and "as registered" not in answer
