"""The server's MLflow writer against a real SQLite store (and a dead port): one run, every step once,
a cursor that survives restarts, and a caller that never waits on MLflow."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import free_port, wait_for

from swarm.protocol import StepMetrics
from swarm.tracking import MlflowRunWriter


class Steps:
    """A step source backed by a list, as the server's buffer is backed by SQLite."""

    def __init__(self) -> None:
        self.rows: list[StepMetrics] = []

    def add(self, step: int, **metrics: float) -> None:
        self.rows = [r for r in self.rows if r.step < step]  # a rollback drops the steps after it
        self.rows.append(StepMetrics(step=step, policy_version=step, time=1000.0 + step, metrics=metrics))

    def __call__(self, after: int, limit: int) -> list[StepMetrics]:
        return [r for r in self.rows if r.step > after][:limit]


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite store for the module (creating its tables costs seconds)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()
    yield uri


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


def test_steps_params_tags_and_status_reach_a_sqlite_store(store_uri: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    steps = Steps()
    for step in range(1, 31):
        steps.add(step, **{"train/reward_mean": step / 30, "train/loss": 1.0 / step})
    cursor = tmp_path / "mlflow.json"
    writer = MlflowRunWriter(store_uri, steps, experiment="manual", run_name="letters",
                             params={"lr": 0.001, "group_size": 8}, cursor_path=cursor, flush_every_s=0.05)
    writer.set_tag("checkpoint/latest", "/ckpt/step-30")
    assert writer.close() is True

    run = MlflowClient(tracking_uri=store_uri).get_run(writer.run_id)
    assert (run.info.status, run.info.run_name) == ("FINISHED", "letters")
    assert run.data.params == {"lr": "0.001", "group_size": "8"}
    assert run.data.tags["checkpoint/latest"] == "/ckpt/step-30"
    assert _history(store_uri, writer.run_id, "train/reward_mean") == [(s, s / 30) for s in range(1, 31)]
    assert len(_history(store_uri, writer.run_id, "train/loss")) == 30
    assert json.loads(cursor.read_text())["delivered_step"] == 30


def test_a_restart_continues_the_same_run_without_duplicates_and_relogs_rolled_back_steps(
        store_uri: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store_uri)
    steps, cursor = Steps(), tmp_path / "mlflow.json"
    for step in range(1, 6):
        steps.add(step, **{"train/reward_mean": 0.1})
    first = MlflowRunWriter(store_uri, steps, experiment="restarts", params={"lr": 1}, cursor_path=cursor,
                            flush_every_s=0.05)
    assert first.close() is True

    for step in range(6, 9):  # trained by the restarted server
        steps.add(step, **{"train/reward_mean": 0.2})
    second = MlflowRunWriter(store_uri, steps, experiment="restarts", params={"lr": 2}, cursor_path=cursor,
                             flush_every_s=0.05)
    wait_for(lambda: second.delivered_step >= 8, 60, what=lambda: f"step 8 delivered (so far {second.delivered_step})")
    assert second.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "RUNNING"  # back to RUNNING while it writes
    assert second.close() is True

    steps.add(7, **{"train/reward_mean": 0.7})  # a crash lost steps 7-8; the restart trains step 7 again
    third = MlflowRunWriter(store_uri, steps, experiment="restarts", cursor_path=cursor, rewind_to=6,
                            flush_every_s=0.05)
    assert third.close("KILLED") is True

    run = client.get_run(first.run_id)
    assert run.info.status == "KILLED"
    assert run.data.params == {"lr": "1"}  # params are logged once per run
    assert "steps 7-8" in run.data.tags["swarm.rolled_back"]
    assert _history(store_uri, first.run_id, "train/reward_mean") == [
        (1, 0.1), (2, 0.1), (3, 0.1), (4, 0.1), (5, 0.1), (6, 0.2), (7, 0.2), (7, 0.7), (8, 0.2)]
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_given_run_id_is_written_into_its_own_params_kept_and_refusals_logged(store_uri: str, caplog: pytest.LogCaptureFixture
                                                                     ) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("study-x")).info.run_id
    client.log_param(run_id, "lr", "0.01")  # the researcher logged its config first
    steps = Steps()
    steps.add(1, **{"train/reward_mean": 0.5})
    writer = MlflowRunWriter(store_uri, steps, run_id=run_id, params={"lr": 0.001, "model": "tiny"},
                             flush_every_s=0.05)
    assert writer.close() is True
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "model": "tiny"}
    assert _history(store_uri, run_id, "train/reward_mean") == [(1, 0.5)]

    with caplog.at_level(logging.ERROR, logger="swarm.tracking"):
        missing = MlflowRunWriter(store_uri, steps, run_id="0" * 32, flush_every_s=0.05)
        assert missing.close(timeout_s=30) is False  # refused: logged, never raised
        unusable = MlflowRunWriter("foo://nowhere", steps, flush_every_s=0.05)
        assert unusable.close(timeout_s=30) is False
    assert f"run {'0' * 32} cannot be opened" in caplog.text
    assert "cannot use the tracking URI 'foo://nowhere'" in caplog.text
    assert "Traceback" not in caplog.text


def test_an_unreachable_store_costs_the_caller_nothing(tmp_path: Path) -> None:
    """MLflow's client retries a dead server for minutes by default; the writer's owner never waits."""
    steps = Steps()
    steps.add(1, **{"train/reward_mean": 0.5})
    started = time.monotonic()
    writer = MlflowRunWriter(f"http://127.0.0.1:{free_port()}", steps, cursor_path=tmp_path / "mlflow.json",
                             flush_every_s=0.05)
    writer.set_tag("checkpoint/latest", "/ckpt")
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    assert writer.close(timeout_s=1.0) is False
    assert time.monotonic() - started < 5.0
    assert writer.delivered_step == 0
