"""A run's ending survives the researcher dying while it stops the run's processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from researcher import runs
from researcher.launcher import Launcher
from researcher.nodes import monitor
from researcher.runs import RunRecord


def _record() -> RunRecord:
    return RunRecord(key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=0, config={},
                     client="client.py", target_step=8, episodes=64, group_size=8, status="running", last_step=8)


def test_stop_saves_the_decision_first_and_resume_completes_it(tmp_path: Path, monkeypatch) -> None:
    launcher = Launcher(["swarm"])
    record = _record()
    runs.save(tmp_path, record)

    def killed(*_args, **_kwargs):  # the researcher dies while stopping the run's client
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr("researcher.launcher.procs.stop_group", killed)
        with pytest.raises(KeyboardInterrupt):
            launcher.stop(tmp_path, record, "finished", "reached step 8")
    saved = runs.load(tmp_path)
    assert saved is not None and saved.status == "running" and saved.ending == "finished"

    # On resume the monitor finishes the same ending (its server is gone: that is not a crash).
    ctx = SimpleNamespace(launcher=launcher, clock=lambda: 0.0, stop_requested=lambda: False)
    ended = monitor._poll(ctx, {"options": {}}, tmp_path, saved)
    assert (ended.status, ended.reason, ended.ending) == ("finished", "reached step 8", None)
    assert runs.load(tmp_path).status == "finished"
