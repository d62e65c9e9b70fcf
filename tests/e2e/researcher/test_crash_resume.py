"""The offline study end to end, with a SIGKILL of the researcher mid-study and a resume, followed live
by `researcher watch` and the daemon's SSE stream across the kill (live_view.py).

Real everything: `researcher start` as a process, `swarm serve` + `swarm run` processes with the tiny
model, LangGraph's SQLite checkpointer and an MLflow SQLite store. The resumed study must continue
from the same step (no second plan, no run launched twice) and finish with a report and closed runs.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from live_view import LiveView
from support import free_port, wait_for
from support.stops import terminate

from researcher.runs import record as runs
from researcher.study.events import read_events
from researcher.tracking import review_view

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


def _check_killed_and_resumed(cli, sid: str, tmp_path: Path) -> None:
    """Killed mid-study, the state says running and nobody holds the lock; `researcher resume` ends it."""
    status = cli.run("status", sid, "--json", *cli.dirs)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert row["state"] == "running" and row["active"] is False and row["iteration"] == 1
    assert row["runs"]["launched"] >= 1 and row["deadline"]
    resumed = cli.run("resume", sid, *cli.dirs, timeout=480)
    assert resumed.returncode == 0, (tmp_path / "start.log").read_text()[-2000:] + resumed.stdout + resumed.stderr


def _check_weights_only(records: list[runs.RunRecord]) -> None:
    """Ended runs keep their checkpoints' weights, a folder that still loads, and shed the optimizer
    state (researcher.runs.shedding)."""
    from transformers import AutoModelForCausalLM

    folders = [w for r in records for w in Path(r.state_dir).glob("checkpoints/step-*/weights")]
    assert len(folders) >= len(records)
    assert all((w / "model.safetensors").is_file() and not (w / "optimizer.pt").exists() for w in folders)
    assert AutoModelForCausalLM.from_pretrained(folders[0]).num_parameters() > 0


def _wait_mid_study(runs_dir: Path, proc, timeout: float = 240) -> list[runs.RunRecord]:
    """Until some run is launched and has trained a couple of steps (the graph is in `monitor`)."""
    def mid_study() -> list[runs.RunRecord]:
        records = runs.all_records(runs_dir)
        return records if any(r.launches == 1 and r.last_step >= 2 for r in records) else []

    return wait_for(mid_study, timeout, what="a run at step 2", proc=proc, interval=0.5)


@pytest.mark.slow
@pytest.mark.timeout(600)  # 160-250 s on 2 cores; over 300 s on a busy machine
def test_sigkill_then_resume_completes_without_launching_twice(cli, tmp_path: Path,
                                                               no_leftover_servers: Callable[[Path], None]) -> None:
    sid = "crash-study"
    runs_dir = cli.artifacts / sid / "runs"
    live = LiveView(cli, tmp_path, sid)
    try:
        proc = cli.popen("start", "--topic", TOPIC, "--budget", "8m", "--study-id", sid, "--steps-per-run", "6",
                         "--seeds", "2", "--parallel", "2", "--max-iterations", "1", "--eval-samples", "2", *cli.dirs,
                         log=tmp_path / "start.log")
        try:
            live.attach(proc)
            before = _wait_mid_study(runs_dir, proc)
            live.check_launches_shown_within_5_s(proc)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        launched_before = {r.key: r.launches for r in before}
        last_event_before = read_events(live.events_file)[-1]["id"]
        _check_killed_and_resumed(cli, sid, tmp_path)
        live.check_after_resume(last_event_before)
    finally:
        live.close()

    records = runs.all_records(runs_dir)
    assert len(records) == 4  # 2 configurations x 2 seeds, each exactly once
    assert all(r.launches == 1 for r in records), [(r.key, r.launches) for r in records]
    assert all(launched_before[k] == 1 for k in launched_before)
    assert {r.status for r in records} == {"finished"}
    # Matched on episodes consumed: group size 8 trains its 6 steps, group size 2 the 24 that use as many.
    assert {r.config["group_size"]: r.target_step for r in records} == {8: 6, 2: 24}
    assert all(r.config.get("coupled") is True for r in records)  # paired arms share their noise by default
    assert all(r.eval_samples == 2 for r in records)  # each held-out task twice a round: its noise is measured
    assert all(r.last_step >= r.target_step for r in records)
    no_leftover_servers(runs_dir)
    _check_weights_only(records)

    study_dir = cli.studies / sid
    plan = json.loads((study_dir / "plan.json").read_text())
    assert list(plan["iterations"]) == ["1"]  # continued the same iteration, did not re-plan
    log_md = (study_dir / "LOG.md").read_text()
    assert log_md.count("Iteration 1 planned") == 1 and "Resumed (phase running" in log_md
    report = (study_dir / "report.md").read_text()
    assert "## Answer" in report and "group_size=8" in report and "figures/iteration-1.png" in report
    assert "Paired arms shared their tasks and sampling noise" in report
    assert "One held-out round's sampling noise, with the weights fixed, was sd" in report
    assert "at 2 samples a task" in report or "within min_effect/4" in report
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
    assert len({m.step for m in history}) >= 6
    # Each child's metrics have one writer (its server), though the researcher was killed and resumed.
    assert all(rec.server_logs_mlflow for rec in records)
    for child in live_children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "train/reward_mean")]
        assert len(steps) == len(set(steps)), f"duplicate metric history in {child.info.run_id}: {sorted(steps)}"
    assert live_children[0].data.params["group_size"] in ("2", "8")
    # Reviewable in the UI: an experiment and runs that say what they are, and the per-episode axis as
    # a cumulative metric of every child.
    description = experiment.tags["mlflow.note.content"]
    assert description.startswith("Answer (done): ") and "Question: " in description and "Topic: " in description
    [parent] = [r for r in found if r.info.run_id in parents]
    assert parent.data.tags["mlflow.note.content"].startswith("Iteration 1 of a study of: ")
    for child in live_children:
        assert child.data.tags["mlflow.note.content"].startswith(f"Training run: arm {child.data.tags['researcher.experiment']}")
        totals = [m.value for m in sorted(client.get_metric_history(child.info.run_id, "train/episodes_total"),
                                          key=lambda m: m.step)]
        assert totals and totals == sorted(totals) and totals[0] > 0

    # One record of each run: the steps its server logged to MLflow, run.json and the report agree
    # (the server trains no step past the target); held-out rounds at the same steps in every run.
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines() if line.startswith(f"| {sid}/")}
    eval_steps = set()
    for rec in records:
        history = client.get_metric_history(rec.mlflow_run_id, "train/reward_mean")
        assert max(m.step for m in history) == rec.last_step == rec.target_step, (rec.key, rec.last_step)
        assert client.get_run(rec.mlflow_run_id).data.tags["researcher.last_step"] == str(rec.target_step)
        assert f"| finished | {rec.last_step}/{rec.target_step} | {rec.client_restarts} |" in rows[rec.key]
        assert rec.client_restarts == 0  # healthy runs: a topped-up client is no restart
        eval_steps.add(tuple(sorted(m.step for m in client.get_metric_history(rec.mlflow_run_id, "eval/reward_mean"))))
    # Held-out rounds at the same episodes in every arm: every 5 steps of 32 episodes (0 and 5 of 6), every 20
    # of 8 episodes (0 and 20 of 24).
    assert eval_steps == {(0, 5), (0, 20)}, eval_steps

    # `researcher ui STUDY` links straight to the study's runs (MLflow's model-training view, grouped by
    # arm: test_mlflow_review renders that), and the real MLflow UI it starts serves the review: driven
    # through its REST API and, where Debian's Chromium is installed, rendered headless.
    ui = subprocess.Popen(cli.argv("ui", sid, "--port", str(free_port()), "--artifacts-dir", str(cli.artifacts)),
                          env=cli.env, cwd=cli.cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        link = ui.stdout.readline()
        assert link.split()[3].endswith(f"/#{review_view.experiment_page(experiment.experiment_id, with_view=True)}"), link
        _review_in_mlflow_ui(link.split()[3], experiment.experiment_id, records, report, tmp_path)
    finally:
        terminate(ui)  # its MLflow server and that server's children end with it
    unknown = cli.run("ui", "no-such-study", "--artifacts-dir", str(cli.artifacts))
    assert unknown.returncode == 2 and "no MLflow experiment for study 'no-such-study'" in unknown.stderr + unknown.stdout


def _review_in_mlflow_ui(page: str, experiment_id: str, records: list[runs.RunRecord], report: str,
                         tmp_path: Path) -> None:
    """What a reviewer gets from the MLflow UI server: the answer in the experiment's description,
    the children in a default runs search, the per-episode axis of every child, and the figures the
    report references as artifacts of the run that holds it; the experiment page (headless Chromium)
    shows the answer."""
    import httpx

    root = page.split("/#/")[0]
    api = f"{root}/api/2.0/mlflow"
    with httpx.Client(timeout=10.0) as http:
        def healthy() -> bool:
            try:
                return http.get(f"{root}/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 90, what="the MLflow UI", interval=0.5)  # slow to start on a busy machine
        answer = report.split("## Answer\n\n", 1)[1].split("\n", 1)[0]
        experiment = http.get(f"{api}/experiments/get", params={"experiment_id": experiment_id}).json()["experiment"]
        description = {t["key"]: t["value"] for t in experiment["tags"]}["mlflow.note.content"]
        assert description.startswith("Answer (done): ") and " ".join(answer.split()) in description

        found = http.post(f"{api}/runs/search", json={"experiment_ids": [experiment_id]}).json()["runs"]
        by_id = {r["info"]["run_id"]: r for r in found}
        assert {rec.mlflow_run_id for rec in records} <= set(by_id)  # children with no filter, no expanding
        for rec in records:
            history = http.get(f"{api}/metrics/get-history",
                               params={"run_id": rec.mlflow_run_id, "metric_key": "train/episodes_total"}).json()
            totals = [m["value"] for m in sorted(history["metrics"], key=lambda m: m["step"])]
            assert len(totals) == rec.last_step and totals == sorted(totals) and totals[0] > 0

        # The report is an artifact at the root of the run the description links, with its figures beside it.
        holder = description.split("/runs/", 1)[1].split("/", 1)[0]
        listed = http.get(f"{api}/artifacts/list", params={"run_id": holder}).json()["files"]
        assert "report.md" in {f["path"] for f in listed}
        text = http.get(f"{root}/get-artifact", params={"path": "report.md", "run_uuid": holder}).text
        figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
        assert figures and "figures/axes.png" in figures
        for path in figures:
            png = http.get(f"{root}/get-artifact", params={"path": path, "run_uuid": holder})
            assert png.status_code == 200 and png.content.startswith(b"\x89PNG"), path
        # The description shows the study's figures from that run (MLflow renders its Markdown).
        shown = re.findall(r"!\[[^\]]*\]\((get-artifact\?[^)]+)\)", description)
        assert shown and all(http.get(f"{root}/{url}").content.startswith(b"\x89PNG") for url in shown)

    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        return  # the rendered check needs Debian's Chromium; the REST checks above ran anyway
    flags = [str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
             "--window-size=1400,1000"]
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=120).stdout
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", dom)).split())  # what the page says, Markdown rendered
    assert " ".join(answer.replace("`", "").split())[:100] in text, "the experiment page does not show the answer"
    assert "get-artifact?path=figures%2Faxes.png" in html.unescape(dom)  # the figure, inline in the description
    shot = tmp_path / "experiment.png"
    subprocess.run([*flags, f"--screenshot={shot}", page], capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
