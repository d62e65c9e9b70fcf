"""``researcher status`` into a pipe: runs as words, long values on one line (real CLI subprocess)."""

from __future__ import annotations

import re

from researcher.findings.records import IterationSummary
from researcher.operations.overview import describe_runs, standing
from researcher.runs import record as runs
from researcher.study.layout import StudyLayout

SID = "words"
TOPIC = "Does a larger group size help the letters task learn faster " + "under a tight wall-clock budget " * 6


def _record(trial: int, status: str, launches: int = 1) -> runs.RunRecord:
    return runs.RunRecord(key=f"{SID}/1/{trial}", study_id=SID, iteration=1, trial=trial, experiment="letters",
                          seed=trial, config={}, client="client.py", target_step=10, episodes=8, group_size=4,
                          status=status, launches=launches)


def test_status_shows_runs_as_words_and_whole_lines(cli) -> None:
    layout = StudyLayout(SID, cli.studies, cli.artifacts)
    layout.study_dir.mkdir(parents=True)
    layout.study_toml.write_text(f'[study]\ntopic = "{TOPIC}"\n')
    statuses = ["finished", "running", "finished", "crashed", "finished", "pending"]
    for trial, status in enumerate(statuses):
        runs.save(layout.run_dir(1, trial), _record(trial, status, launches=0 if status == "pending" else 1))
    cli.env.pop("COLUMNS", None)  # the fixture's 200 columns would hide an 80-column wrap

    shown = cli.run("status", SID, *cli.dirs, timeout=120)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "{" not in shown.stdout and "by_status" not in shown.stdout
    lines = shown.stdout.splitlines()
    # Piped: plain text at most 100 columns; the long topic wraps at words inside its cell, whole.
    assert all(len(line) <= 100 for line in lines), shown.stdout
    cells = " ".join(line.split("│")[2].strip() for line in lines if line.count("│") >= 3 and
                     line.split("│")[1].strip() in ("topic", ""))
    assert TOPIC.strip() in cells, shown.stdout
    assert any("5 launched: 3 finished, 1 running, 1 pending, 1 crashed" in line for line in lines), shown.stdout
    assert any(re.findall(r"\w+", line) == ["active", "no"] for line in lines), shown.stdout  # not "False"


def test_describe_runs() -> None:
    assert describe_runs({"launched": 0, "by_status": {}}) == "none yet"
    assert describe_runs({"launched": 2, "by_status": {"weird": 1, "stopped": 1}}) == "2 launched: 1 stopped, 1 weird"


def test_status_names_a_best_only_where_the_verdict_rules_resolve_one() -> None:
    """The ``researcher status`` answer line before the report: "best" only for a Yes/No of the rules."""
    def line(diff: float, hw: float | None, **study: object) -> str:
        return standing(IterationSummary.model_validate({
            "iteration": 1, "knob": "lr", "comparison": {"better": "a", "worse": "b", "diff": diff, "hw": hw},
            "study": {"knob": "lr", "metric": "train/reward_mean", "min_effect": 0.02, **study}}), 0.05)

    assert line(0.104, 0.05) == "best so far"
    assert line(0.012, 0.010) == "leading so far (a difference below the minimum of interest)"
    assert line(0.004, 0.01) == "leading so far (no meaningful difference)"
    assert line(0.09, 0.142) == line(0.3, None) == "leading so far (inconclusive)"
    expected = "leading so far (no verdict: too few points in an arm's window)"
    assert line(0.104, 0.05, short="No verdict per training step: …") == expected
    assert standing(IterationSummary(iteration=1, knob="lr"), 0.02) == "best so far"  # one arm: nothing to compare
