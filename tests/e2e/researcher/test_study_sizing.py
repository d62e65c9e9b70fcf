"""Studies sized from their pilot:

- a pilot whose spread says the budget cannot decide: the study says so before its next runs start, and
  the Answer repeats it (the graph's nodes on a real study layout);
- a 10-minute study on letters uses at least 80% of its budget, or ends settled and says so (``-m study``).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from node_study import finish_trials, node_study

from researcher.findings.verdicts import Verdict, answer_class
from researcher.runs import record as runs
from researcher.session.nodes import analyze, decide, plan_experiments, write_report
from researcher.study import files as studyfiles
from researcher.types.settings import StudyOptions

AA_TOPIC = "A/A check: do two identical configurations of letters learn at different speeds?"


def _answer(cli: Any, sid: str) -> str:
    return (cli.studies / sid / "report.md").read_text().split("## Answer\n\n", 1)[1].split("\n", 1)[0]


def test_a_pilot_that_shows_the_budget_cannot_decide_says_so_before_the_next_runs(tmp_path: Path) -> None:
    """The graph's nodes on a real study layout and MLflow store, the pilot's runs written as the monitor
    writes them: a pilot whose paired difference spreads 0.057 cannot resolve ±0.02 in a 10-minute budget.
    decide says so (LOG.md, the terminal's events, plan.json) before the next look is planned, the next
    look still runs what fits, and the report's Answer repeats it."""
    events: list[tuple[str, dict[str, Any]]] = []
    ctx, state = node_study(tmp_path, "cannot-decide", AA_TOPIC, StudyOptions(seeds=2, max_iterations=2), run_s=60.0,
                            runs_launched=4, budget_s=600, emit=lambda event, data: events.append((event, data)))
    layout = ctx.layout
    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    # The pilot's runs: flat curves whose per-seed difference is -0.03 and +0.05 (mean 0.01, sd 0.057).
    level = {("it1-a", 1000): 0.30, ("it1-a-copy", 1000): 0.33, ("it1-a", 1001): 0.40, ("it1-a-copy", 1001): 0.35}
    finish_trials(state, lambda trial: level[trial["experiment"], trial["seed"]])
    state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
    state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    design = studyfiles.read_plan(layout).design
    assert design is not None and design.reachable is False and design.looks == 2 and design.pilot_seeds == 2
    assert design.needed_seeds is not None and design.max_seeds is not None and design.needed_seeds > design.max_seeds
    assert re.fullmatch(r"The budget cannot decide this: the pilot's spread \(paired difference sd 0\.0566\) needs "
                        r"about \d+ seeds an arm to resolve ±0\.02 at 80% power, about [0-9.]+ (hours|minutes) more here, "
                        r"and the budget runs only \d+\. The study runs what fits\.", design.sizing), design.sizing
    assert ("sized", {"text": design.sizing, "reachable": False, "needed": design.needed_seeds,
                      "max_seeds": design.max_seeds}) in events
    assert state["decision"]["action"] == "continue", state["decision"]  # what fits still runs
    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    log = layout.log_md.read_text()
    assert log.index("Iteration 1 analysed") < log.index(design.sizing) < log.index("Iteration 2 planned")
    look = studyfiles.read_plan(layout).iteration(2).look
    assert look is not None and look.fraction == 1.0 and look.seeds == design.max_seeds  # the last look spends it all
    state |= write_report.write({**state, "phase": "reporting"}, ctx)  # type: ignore[arg-type]
    answer = layout.report_md.read_text().split("## Answer\n\n", 1)[1].split("\n", 1)[0]
    assert answer.endswith(design.sizing) and not answer.startswith(("Yes", "No:")), answer


def test_a_pilot_the_budget_runs_no_look_after_is_the_only_look_and_decides(tmp_path: Path) -> None:
    """A budget that fits the pilot and nothing more (a run took 300 s, 250 s are left): the pilot is
    amended to the study's only look before its analysis (plan.json, LOG.md), spends the whole alpha and
    answers a clear difference, where a pilot with room after it decides nothing."""
    ctx, state = node_study(tmp_path, "pilot-only", "Does a learning rate of 3e-3 beat 3e-5 on letters?",
                            StudyOptions(seeds=3, max_iterations=3), run_s=300.0, runs_launched=6, budget_s=3600)
    layout = ctx.layout
    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    assert studyfiles.read_plan(layout).iteration(1).look.fraction is None  # registered as a pilot
    finish_trials(state, lambda trial: (0.5 if "0_003" in trial["experiment"] else 0.1) + 0.01 * (trial["seed"] % 3))
    state["budget"]["deadline"] = time.time() + 250  # the pilot took the time: no second look fits
    state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
    assert studyfiles.read_plan(layout).iteration(1).look.fraction == 1.0
    assert "the pilot is the study's only look and spends the whole alpha" in layout.log_md.read_text()
    comparison = state["iterations"][-1]["study"]["comparison"]
    assert comparison["look"] == 1 and comparison["fraction"] == 1.0 and comparison["hw"] < 0.1
    state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    assert state["decision"]["action"] == "conclude"
    state |= write_report.write({**state, "phase": "reporting"}, ctx)  # type: ignore[arg-type]
    answer = layout.report_md.read_text().split("## Answer\n\n", 1)[1].split("\n", 1)[0]
    assert answer_class(answer) is Verdict.YES, answer


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
