"""A run's ending survives the researcher dying while it stops the run's processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.runs.record import RunRecord
from researcher.session.nodes import monitor


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
        patch.setattr("researcher.runs.launcher.detached.stop_group", killed)
        with pytest.raises(KeyboardInterrupt):
            launcher.stop(tmp_path, record, "finished", "reached step 8")
    saved = runs.load(tmp_path)
    assert saved is not None and saved.status == "running" and saved.ending == "finished"

    # On resume the monitor finishes the same ending (its server is gone: that is not a crash).
    ctx = SimpleNamespace(launcher=launcher, clock=lambda: 0.0, stop_requested=lambda: False)
    ended = monitor._poll(ctx, {"options": {}}, tmp_path, saved)
    assert (ended.status, ended.reason, ended.ending) == ("finished", "reached step 8", None)
    assert runs.load(tmp_path).status == "finished"


def test_a_client_that_ran_all_its_episodes_is_topped_up_not_counted_as_a_failure(tmp_path: Path) -> None:
    """Only a client that failed counts toward ``max_client_restarts`` (and the report's restarts): one
    whose `swarm run` printed its summary line used up its episodes, whatever came before in the log."""
    launcher, record = Launcher(["swarm"]), _record()
    log = tmp_path / "client.log"
    log.write_text("swarm run ...\nfinished=120 aborted=0 mean_reward=0.4 seconds=9.0 policy_version=20\n")
    assert launcher.client_used_up(tmp_path, record)
    record.client_log_offset = log.stat().st_size  # a second client started after it, then died
    with open(log, "a") as out:
        out.write("Traceback (most recent call last):\nSwarmError: claim failed\n")
    assert not launcher.client_used_up(tmp_path, record)

    ctx = SimpleNamespace(launcher=launcher)
    poll = monitor.Poll(ctx, {"options": {"max_client_restarts": 1}}, tmp_path, record, 0.0, server_alive=True)
    assert monitor._client_gave_up(poll) is None  # no restart yet: one is allowed
    record.client_restarts, record.client_failures_in_a_row, record.client_failed_at_step = 1, 1, record.last_step
    status, reason = monitor._client_gave_up(poll)
    assert status == "crashed" and reason.startswith("client failed 2 times in a row")


def test_client_failures_count_in_a_row_a_training_step_starts_the_count_again(tmp_path: Path) -> None:
    """A run of days whose client is killed now and then, training between the kills, is not crashed for
    it (the soak's SIGKILLed clients once used up ``max_client_restarts`` over a run's life); a client
    that fails again and again with no step between is. Real client processes, killed with SIGKILL."""
    import subprocess

    launcher, record = Launcher(["swarm"]), _record()
    (tmp_path / "client.log").write_text("")
    poll = monitor.Poll(SimpleNamespace(launcher=launcher), {"options": {"max_client_restarts": 2}}, tmp_path, record,
                        0.0, server_alive=True)
    restarts = []
    for step in (3, 3, 9, 9, 9):  # the step the run is at when its client dies
        client = subprocess.Popen(["sleep", "60"])
        record.client_pid, record.last_step = client.pid, step
        client.kill()
        client.wait()
        ending = monitor._client_gave_up(poll)
        restarts.append(ending is None)
        if ending is None:  # _poll counts the failure, then starts the next client
            monitor._count_client_failure(record)
    # step 3: two restarts; step 9 (a step since): the count starts again, two more, the third in a row crashes
    assert restarts == [True, True, True, True, False], restarts
    assert record.client_restarts == 4


def test_a_run_at_its_target_waits_for_the_target_step_s_round(tmp_path: Path) -> None:
    """Rounds at 0, 5, …: a run at step 10 stops once the round of step 10 is logged, or after a wait."""
    from swarm.protocol import StepMetrics

    record = _record()
    record.target_step, record.last_progress_at = 10, 100.0
    runs.append_metrics(tmp_path, [StepMetrics(step=s, policy_version=s, time=0.0, metrics={"eval/reward_mean": 0.1})
                                   for s in (0, 5)])
    status = SimpleNamespace(step=10)
    poll = monitor.Poll(SimpleNamespace(), {"options": {}}, tmp_path, record, 101.0, server_alive=True, status=status)
    assert monitor._reached_target(poll) is None
    poll.now = 100.0 + monitor.FINAL_ROUND_WAIT_S
    assert monitor._reached_target(poll) == ("finished", "reached step 10")
    poll.now = 101.0
    runs.append_metrics(tmp_path, [StepMetrics(step=10, policy_version=10, time=0.0, metrics={"eval/reward_mean": 0.2})])
    assert monitor._reached_target(poll) == ("finished", "reached step 10")
    record.target_step = 12  # not a multiple of the cadence: no round is due there
    status.step = 12
    assert monitor._reached_target(poll) == ("finished", "reached step 12")
