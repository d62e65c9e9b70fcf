"""Studies placed on a real two-node Ray cluster on this machine (``ray_cluster.two_node_cluster``).

Each node has one CPU and each run asks for one, so two live runs land one on each node; the
study must finish with the same kind of report as a local one. The fault test kills node_b's
raylet while a run trains there: the run's server job fails, the researcher resubmits it and it
resumes from its checkpoint in the (shared) run dir on node_a. The researcher itself is SIGKILLed
and resumed mid-study in the same test: it re-attaches to the jobs and submits nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import Cluster, two_node_cluster
from support import free_port, wait_for

from researcher.runs import record as runs

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


@pytest.fixture
def cluster(cli) -> Iterator[Cluster]:
    with two_node_cluster(cli.env, also=[cli.artifacts, cli.studies]) as found:
        yield found


def _placements(cli, sid: str) -> list[dict]:
    done = cli.run("status", sid, "--json", *cli.dirs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["placements"]


def _jobs_of(cluster: Cluster) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    return [j.submission_id for j in JobSubmissionClient(cluster.dashboard).list_jobs()]


@pytest.mark.slow
@pytest.mark.study  # about 2.5 minutes of CI worker time (two `ray start` nodes): run with -m study
@pytest.mark.timeout(600)
def test_a_study_on_two_ray_nodes(cli, cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Placed through the GCS address ``ray start --head`` prints (HOST:PORT), in a shell whose
    RAY_ADDRESS names a dashboard of no cluster, as Ray's job docs have users export: the explicit
    address wins (Ray's clients alone would take the variable's)."""
    from researcher.runs import ray_address

    nowhere = f"http://127.0.0.1:{free_port()}"
    with monkeypatch.context() as patch:  # this test's own Ray calls below must not see it
        patch.setenv("RAY_ADDRESS", nowhere)
        assert ray_address.dashboard_url(cluster.gcs) == cluster.dashboard
        assert os.environ["RAY_ADDRESS"] == nowhere  # hidden from Ray only while it resolved the address
    from ray.experimental import internal_kv

    # Resolved in a child: a GCS client left in this process (Ray's global one) would end it, status 1 and
    # silently, at its next Ray call once this cluster has gone (it ended whole CI runs at a later test).
    assert not internal_kv._internal_kv_initialized()
    cli.env["RAY_ADDRESS"] = nowhere
    sid = "on-ray"
    runs_dir = cli.artifacts / sid / "runs"
    proc = cli.popen("start", "--topic", TOPIC, "--budget", "8m", "--study-id", sid, "--steps-per-run", "3",
                     "--seeds", "2", "--parallel", "2", "--max-iterations", "1", "--ray-address", cluster.gcs,
                     *cli.dirs, log=tmp_path / "start.log")
    nodes_seen: set[str] = set()
    try:
        def ended() -> bool:  # noting meanwhile where the runs were placed
            if runs_dir.is_dir():
                nodes_seen.update(p["node"] for p in _placements(cli, sid) if p["node"])
            return proc.poll() is not None

        wait_for(ended, 400, what="the study to end", interval=2, log=tmp_path / "start.log")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "start.log").read_text()
    assert proc.returncode == 0, log[-4000:]
    names = cluster.node_names()
    placements = _placements(cli, sid)
    assert len(placements) == 4 and all(p["placement"] == "ray" and p["status"] == "finished" for p in placements)
    assert all(p["resources"] == {"CPU": 1.0} for p in placements)
    assert {names.get(n) for n in nodes_seen | {p["node"] for p in placements}} == {"node_a", "node_b"}, \
        (nodes_seen, names)
    records = runs.all_records(runs_dir)
    assert all(r.launches == 1 and r.resumes == 0 for r in records)
    weights = [w for r in records for w in Path(r.state_dir).glob("checkpoints/step-*/weights")]  # ended: shed
    assert len(weights) >= 4 and all((w / "model.safetensors").is_file() and not (w / "optimizer.pt").exists()
                                     for w in weights)
    jobs = _jobs_of(cluster)
    assert len(jobs) == len(set(jobs)) and all(j in jobs for r in records for j in r.jobs)
    # No token on a job's command line, metadata or runtime env; the servers' tokens stay in their state dirs.
    from ray.job_submission import JobSubmissionClient

    described = json.dumps([j.model_dump() for j in JobSubmissionClient(cluster.dashboard).list_jobs()], default=str)
    for run_dir in sorted(d for d in runs_dir.iterdir() if d.is_dir()):  # logs are in the run dir: ours and Ray's
        assert "Ray job" in (run_dir / "ray-jobs.log").read_text()
        assert "ready: swarm server" in (run_dir / "server.log").read_text()
        client_log = (run_dir / "client.log").read_text()
        # The client ran there and ended: its own summary, or stopped by the researcher once the run
        # reached its target step (the server ends at max_steps while the client may still be claiming).
        assert "swarm.client" in client_log and ("finished=" in client_log or "interrupted" in client_log), client_log
        for token in (run_dir / "server").glob("*token"):
            assert token.read_text().strip() not in described
    report = (cli.studies / sid / "report.md").read_text()
    assert "## Answer" in report and "group_size=8" in report and "figures/iteration-1.png" in report


@pytest.mark.study
@pytest.mark.timeout(1500)
def test_node_death_and_researcher_sigkill_on_ray(cli, cluster: Cluster, tmp_path: Path) -> None:
    sid = "ray-faults"
    runs_dir = cli.artifacts / sid / "runs"
    names = cluster.node_names()
    proc = cli.popen("start", "--topic", TOPIC, "--budget", "15m", "--study-id", sid, "--steps-per-run", "60",
                     "--seeds", "2", "--parallel", "2", "--max-iterations", "1", "--ray-address", cluster.dashboard,
                     *cli.dirs, log=tmp_path / "start.log")
    try:
        # The researcher is SIGKILLed once both nodes train a run.
        wait_for(lambda: {"node_a", "node_b"} <= {names.get(r.node) for r in runs.all_records(runs_dir)
                                                   if r.node and r.last_step >= 2},
                 400, what="a run training on each node", interval=1, proc=proc, log=tmp_path / "start.log")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    jobs_before = set(_jobs_of(cluster))
    launched_before = {r.key: r.jobs[0] for r in runs.all_records(runs_dir) if r.launches}
    resumed = cli.popen("resume", sid, *cli.dirs, log=tmp_path / "resume.log")
    log_md = cli.studies / sid / "LOG.md"
    try:
        wait_for(lambda: "Resumed (phase running" in log_md.read_text(), 120, what="the resumed study in LOG.md",
                 interval=0.5, proc=resumed, log=tmp_path / "resume.log")
        victims = [r.key for r in runs.all_records(runs_dir) if names.get(r.node) == "node_b" and not r.ended]
        assert victims, "the run on node_b ended before its node could be killed"
        cluster.kill_node("b")
        resumed.wait(timeout=900)
    finally:
        if resumed.poll() is None:
            os.kill(resumed.pid, signal.SIGKILL)
            resumed.wait()
    assert resumed.returncode == 0, (tmp_path / "resume.log").read_text()[-4000:]
    records = {r.key: r for r in runs.all_records(runs_dir)}
    assert len(records) == 4 and {r.status for r in records.values()} == {"finished"}
    assert all(r.launches == 1 for r in records.values())
    # Re-attached, not resubmitted: every run's first server job is the one submitted before the kill.
    assert all(records[k].jobs[0] == job for k, job in launched_before.items())
    assert jobs_before <= set(_jobs_of(cluster))
    victim = records[victims[0]]
    assert victim.resumes == 1 and names.get(victim.node) == "node_a", (victim.jobs, victim.node)
    assert sum(1 for j in victim.jobs if "-server-" in j) == 2
    victim_dir = runs_dir / f"{victim.iteration:02d}-{victim.trial:02d}"
    assert "restored checkpoint step" in (victim_dir / "server.log").read_text()  # not retrained from step 0
    assert "restarted, resuming from its checkpoint" in log_md.read_text()
    assert "## Answer" in (cli.studies / sid / "report.md").read_text()
