"""The offline study end to end, with a SIGKILL of the researcher mid-study and a resume.

Real everything: `researcher start` as a process, `swarm serve` + `swarm run` processes with the tiny
model, LangGraph's SQLite checkpointer and an MLflow SQLite store. The resumed study must continue
from the same step (no second plan, no run launched twice) and finish with a report and closed runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import wait_for

from researcher import runs

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


def _wait_mid_study(runs_dir: Path, proc, timeout: float = 240) -> list[runs.RunRecord]:
    """Until some run is launched and has trained a couple of steps (the graph is in `monitor`)."""
    def mid_study() -> list[runs.RunRecord]:
        records = runs.all_records(runs_dir)
        return records if any(r.launches == 1 and r.last_step >= 2 for r in records) else []

    return wait_for(mid_study, timeout, what="a run at step 2", proc=proc, interval=0.5)


@pytest.mark.slow
def test_sigkill_then_resume_completes_without_launching_twice(cli, tmp_path: Path,
                                                               no_leftover_servers: Callable[[Path], None]) -> None:
    sid = "crash-study"
    runs_dir = cli.artifacts / sid / "runs"
    proc = cli.popen("start", "--topic", TOPIC, "--budget", "8m", "--study-id", sid, "--steps-per-run", "8",
                     "--seeds", "2", "--parallel", "2", "--max-iterations", "1", *cli.dirs, log=tmp_path / "start.log")
    try:
        before = _wait_mid_study(runs_dir, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    launched_before = {r.key: r.launches for r in before}

    # Killed mid-study: the state says running, nobody holds the lock, runs were left RUNNING in MLflow.
    status = cli.run("status", sid, "--json", *cli.dirs)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert row["state"] == "running" and row["active"] is False and row["iteration"] == 1
    assert row["runs"]["launched"] >= 1 and row["deadline"]

    resumed = cli.run("resume", sid, *cli.dirs, timeout=480)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    records = runs.all_records(runs_dir)
    assert len(records) == 4  # 2 configurations x 2 seeds, each exactly once
    assert all(r.launches == 1 for r in records), [(r.key, r.launches) for r in records]
    assert all(launched_before[k] == 1 for k in launched_before)
    assert {r.status for r in records} == {"finished"}
    assert all(r.last_step >= 8 for r in records)
    no_leftover_servers(runs_dir)

    study_dir = cli.studies / sid
    plan = json.loads((study_dir / "plan.json").read_text())
    assert list(plan["iterations"]) == ["1"]  # continued the same iteration, did not re-plan
    log_md = (study_dir / "LOG.md").read_text()
    assert log_md.count("Iteration 1 planned") == 1 and "Resumed (phase running" in log_md
    report = (study_dir / "report.md").read_text()
    assert "## Answer" in report and "group_size=8" in report and "figures/iteration-1.png" in report
    assert (study_dir / "figures" / "iteration-1.png").stat().st_size > 1000

    final = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
    assert final["state"] == "done" and final["runs"]["by_status"] == {"finished": 4}

    # MLflow: one parent run, four nested children with per-step metrics, nothing left RUNNING.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(sid)
    found = client.search_runs([experiment.experiment_id], max_results=100)
    assert all(r.info.status != "RUNNING" for r in found)
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId")]
    live_children = [r for r in children if r.info.run_id in {rec.mlflow_run_id for rec in records}]
    assert len(live_children) == 4 and all(r.info.status == "FINISHED" for r in live_children)
    parents = {r.data.tags["mlflow.parentRunId"] for r in live_children}
    assert len(parents) == 1
    history = client.get_metric_history(live_children[0].info.run_id, "train/reward_mean")
    assert len({m.step for m in history}) >= 8
    # Each child's metrics have one writer (its server), though the researcher was killed and resumed.
    assert all(rec.server_logs_mlflow for rec in records)
    for child in live_children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "train/reward_mean")]
        assert len(steps) == len(set(steps)), f"duplicate metric history in {child.info.run_id}: {sorted(steps)}"
    assert live_children[0].data.params["group_size"] in ("2", "8")
    # Reviewable in the UI: an experiment and runs that say what they are, and the per-episode axis as
    # a cumulative metric of every child.
    description = experiment.tags["mlflow.note.content"]
    assert description.startswith("Topic: ") and "Question: " in description and "Answer (done): " in description
    [parent] = [r for r in found if r.info.run_id in parents]
    assert parent.data.tags["mlflow.note.content"].startswith("Iteration 1 of a study of: ")
    for child in live_children:
        assert child.data.tags["mlflow.note.content"].startswith(f"Training run: arm {child.data.tags['researcher.experiment']}")
        totals = [m.value for m in sorted(client.get_metric_history(child.info.run_id, "train/episodes_total"),
                                          key=lambda m: m.step)]
        assert totals and totals == sorted(totals) and totals[0] > 0

    # `researcher ui STUDY` links straight to the study's runs (MLflow's model-training view); an
    # unknown study is refused before any server starts.
    ui = subprocess.Popen(cli.argv("ui", sid, "--port", "5999", "--artifacts-dir", str(cli.artifacts)), env=cli.env,
                          cwd=cli.cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        link = ui.stdout.readline()
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
    assert f"/#/experiments/{experiment.experiment_id}?workflowType=machine_learning" in link, link
    unknown = cli.run("ui", "no-such-study", "--artifacts-dir", str(cli.artifacts))
    assert unknown.returncode == 2 and "no MLflow experiment for study 'no-such-study'" in unknown.stderr + unknown.stdout
