"""Goal campaigns (issue #60) through the CLI, on a task the search was not tuned on (digits): a goal in
words becomes rounds of ordinary studies (screen, confirm, refine, combine, verify) that write a ledger
with a headline, both figures with their data, and a search run in MLflow.

The whole round takes tens of minutes on 2 cores, so it runs under `-m study`; the decisions themselves
are checked in the default run by simulation (tests/unit/researcher/campaign/test_discovery.py), and
the goal's reading, the stage designs and the budget's refusal by tests/unit/researcher/campaign/
test_goal_campaign.py."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest


@pytest.mark.study
@pytest.mark.timeout(3000)
def test_a_goal_campaign_on_digits_runs_a_whole_round_in_35_minutes(cli, tmp_path: Path) -> None:
    started = time.monotonic()
    done = cli.run("campaign", "start", "--goal", "Make the digits task learn faster per episode consumed",
                   "--name", "digits-goal", "--budget", "35m", *cli.dirs, timeout=2900)
    minutes = (time.monotonic() - started) / 60
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rec = json.loads((cli.studies / "digits-goal" / "campaign.json").read_text())
    search = rec["discovery"]
    kinds = [c["stage"]["kind"] for c in rec["claims"]]
    # A whole round: its screen, and then either convergence (nothing flagged or held) or its combination.
    assert kinds[0] == "screen" and all(c["recorded"] for c in rec["claims"] if c["phase"] == "done")
    assert search["converged"] or search["round"] >= 2 or "combine" in kinds, (kinds, search)
    ledger = (cli.studies / "digits-goal" / "ledger.md").read_text()
    assert "Goal: Make the digits task learn faster per episode consumed" in ledger
    assert "**Best configuration so far: {" in ledger or "**Nothing beat the baseline: " in ledger, ledger[:3000]
    # Both figures, even where the screen flagged nothing: its effects and arms show why.
    rows = len(search["tests"]) + sum(len(s["effects"]) + len(s["arms"]) for s in search["screens"])
    for name in ("progress", "forest"):
        figure = cli.studies / "digits-goal" / "figures" / f"{name}.png"
        assert figure.stat().st_size > 1000
        with figure.with_suffix(".csv").open() as f:
            assert len(list(csv.DictReader(f))) == rows
    # Selection and confirmation never share a seed: every stage's study drew its own block.
    bases = [c["stage"]["seed_base"] for c in rec["claims"]]
    assert len(set(bases)) == len(bases)
    print(f"\ngoal campaign on digits: {len(kinds)} stages ({', '.join(kinds)}) in {minutes:.1f} min; {rec['ended']}")
    assert minutes <= 40  # 35 minutes of budget, and the last session's report
