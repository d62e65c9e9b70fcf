"""The server's MLflow writer against a real SQLite store."""

from __future__ import annotations

from pathlib import Path

from swarm.tracking import MlflowRunWriter


def test_steps_params_and_status_reach_a_sqlite_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    writer = MlflowRunWriter(uri, experiment="manual", params={"lr": 0.001, "group_size": 8}, flush_every_s=0.05)
    for step in range(1, 31):
        writer.log_step(step, {"train/reward_mean": step / 30, "train/loss": 1.0 / step})
    writer.set_tag("checkpoint", "step-30")
    writer.close()

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(writer.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.001", "group_size": "8"}
    assert run.data.tags["checkpoint"] == "step-30"
    history = client.get_metric_history(writer.run_id, "train/reward_mean")
    assert sorted(m.step for m in history) == list(range(1, 31))
    assert max(history, key=lambda m: m.step).value == 1.0


def test_existing_run_id_is_reused_so_each_run_has_one_writer(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("study-x")
    run_id = client.create_run(exp).info.run_id
    writer = MlflowRunWriter(uri, run_id=run_id)
    writer.log_step(1, {"train/reward_mean": 0.5})
    writer.close("KILLED")
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_metric_history(run_id, "train/reward_mean")[0].value == 0.5
