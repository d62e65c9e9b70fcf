"""The run-status table: every status has its moves, ends are final, and ``move`` refuses the rest."""

from __future__ import annotations

import json

import pytest

from researcher.runs import record as runs
from researcher.runs import status as run_status
from researcher.runs.status import ENDED, LIVE, TRANSITIONS, IllegalTransition, RunStatus
from researcher.study.state import Trial, advance_trial, sync_trial


def _record(status: str = "pending") -> runs.RunRecord:
    return runs.RunRecord(key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=1, config={},
                          client="c.py", target_step=3, episodes=8, group_size=2, status=status)


def test_every_status_has_a_row_and_ends_are_final() -> None:
    assert set(TRANSITIONS) == set(RunStatus)
    assert set(RunStatus) == LIVE | ENDED and not LIVE & ENDED
    for end in ENDED:
        assert TRANSITIONS[end] == frozenset() and run_status.can_move(end, end)  # saving again is no move
    assert {s.value for s in RunStatus} >= {"pending", "queued", "running", "parked", "finished", "cut", "crashed",
                                            "stalled", "diverged", "stopped", "skipped"}


@pytest.mark.parametrize(("start", "path"), [
    ("pending", ["queued", "running", "parked", "running", "finished"]),  # queued, launched, parked, resumed
    ("pending", ["running", "stalled"]),
    ("pending", ["crashed"]),                                # its server could not start
    ("pending", ["queued", "skipped"]),                      # no time left while it waited
    ("parked", ["queued", "parked", "cut"]),                 # a parked run waits for a slot, then the deadline
    ("running", ["diverged"]),
])
def test_the_lives_a_run_leads_are_allowed(start: str, path: list[str]) -> None:
    record = _record(start)
    for status in path:
        run_status.move(record, status)
        assert record.status == status
    assert record.ended


@pytest.mark.parametrize(("start", "to"), [("finished", "running"), ("crashed", "running"), ("cut", "parked"),
                                           ("running", "pending"), ("running", "queued"), ("stopped", "finished"),
                                           ("skipped", "running"), ("pending", "finished"), ("pending", "diverged")])
def test_an_illegal_move_is_refused_and_leaves_the_record_as_it_was(start: str, to: str) -> None:
    record = _record(start)
    with pytest.raises(IllegalTransition, match=f"a {start} run cannot become {to}"):
        run_status.move(record, to, "a late poll")
    assert record.status == start and record.reason == ""


def test_run_json_keeps_the_plain_words_and_old_files_load(tmp_path) -> None:
    record = _record()
    run_status.move(record, RunStatus.RUNNING, "")
    runs.save(tmp_path, record)
    assert json.loads((tmp_path / runs.RUN_FILE).read_text())["status"] == "running"
    raw = json.loads((tmp_path / runs.RUN_FILE).read_text()) | {"status": "cut", "ending": None}
    (tmp_path / runs.RUN_FILE).write_text(json.dumps(raw))  # as an older researcher wrote it
    loaded = runs.load(tmp_path)
    assert loaded is not None and loaded.status is RunStatus.CUT and loaded.ended


def test_a_trial_copies_its_records_status_and_moves_alone_only_without_one() -> None:
    trial: Trial = {"trial": 0, "key": "s/1/0", "experiment": "e", "seed": 1, "run_dir": "r", "status": "pending"}
    advance_trial(trial, RunStatus.QUEUED)
    assert trial["status"] == "queued" and type(trial["status"]) is str  # the checkpoint holds plain strings
    record = run_status.move(_record(), RunStatus.RUNNING)
    assert sync_trial(trial, record) is RunStatus.RUNNING and type(trial["status"]) is str
    with pytest.raises(IllegalTransition):
        advance_trial(trial, RunStatus.SKIPPED)  # a running run is never "skipped"
    assert sync_trial(trial, None) is RunStatus.RUNNING  # no record: the trial keeps its own
