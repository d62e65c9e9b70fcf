"""The MLflow spool survives a damaged line: it moves to ``spool.bad`` and every other op replays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from researcher.tracking.spool import Spool


def test_bad_lines_move_to_spool_bad_and_later_writes_replay(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "mlflow_spool")
    spool.append("log_metric", {"run": "a", "value": 1})
    with spool.ops_file.open("ab") as out:
        out.write(b"\x00\xffgarbage that is not json\n")
    spool.append("log_metric", {"run": "a", "value": 2})
    with spool.ops_file.open("ab") as out:
        out.write(b'{"op": "log_metric", "args": {"run": "a", "val')  # a write cut short: no newline
    spool.append("end_run", {"run": "a"})  # starts on a line of its own, not glued to the cut one
    assert spool.pending() == 5

    applied: list[tuple[str, dict[str, Any]]] = []
    assert spool.replay(lambda op, args: applied.append((op, args))) == 3
    assert applied == [("log_metric", {"run": "a", "value": 1}), ("log_metric", {"run": "a", "value": 2}),
                       ("end_run", {"run": "a"})]
    assert spool.pending() == 0
    bad = spool.bad_file.read_text(errors="replace").splitlines()
    assert len(bad) == 2 and "garbage that is not json" in bad[0] and bad[1].endswith('"val')

    spool.append("log_param", {"run": "b"})  # later writes and replays go on as usual
    assert spool.replay(lambda op, args: applied.append((op, args))) == 1
    assert applied[-1] == ("log_param", {"run": "b"}) and spool.pending() == 0


def test_a_failing_op_keeps_itself_and_the_rest_for_the_next_replay(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for value in range(3):
        spool.append("log_metric", {"value": value})
    spool.ops_file.write_text(spool.ops_file.read_text() + "not json\n")

    def apply(op: str, args: dict[str, Any]) -> None:
        if args["value"] == 1:
            raise ConnectionError("store down")

    with pytest.raises(ConnectionError):
        spool.replay(apply)
    assert spool.pending() == 3  # value 1, value 2 and the bad line wait; value 0 was applied
    assert not spool.bad_file.exists()  # not reached yet
