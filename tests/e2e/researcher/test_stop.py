"""`researcher stop` on a study running on an existing server (`--server URL`): its run ends as
stopped, the study still writes its report, and the existing server is left running."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from support import wait_for

from researcher.runs import record as runs


@pytest.mark.slow
def test_stop_on_existing_server_ends_runs_and_writes_report(cli, swarm_server: tuple[str, str], tmp_path: Path) -> None:
    url, token = swarm_server
    cli.env["SWARM_TOKEN"] = token
    sid = "stop-study"
    runs_dir = cli.artifacts / sid / "runs"
    proc = cli.popen("start", "--topic", "group size on letters", "--budget", "10m", "--study-id", sid,
                     "--server", url, "--steps-per-run", "1000", "--seeds", "1", "--max-runs", "2", *cli.dirs,
                     log=tmp_path / "start.log")
    try:
        wait_for(lambda: any(r.last_step >= 1 for r in runs.all_records(runs_dir)), 240, what="a run's first step",
                 interval=0.3, proc=proc, log=tmp_path / "start.log")
        stopped = cli.run("stop", sid, *cli.dirs)
        assert stopped.returncode == 0 and "stop requested" in stopped.stdout
        assert proc.wait(timeout=120) == 0, (tmp_path / "start.log").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    records = runs.all_records(runs_dir)
    assert len(records) == 1  # stopped before the second configuration was launched
    record = records[0]
    assert record.status == "stopped" and record.external and record.url == url and record.server_pid is None
    assert record.config["group_size"] == 2
    # The existing server took the run's config and is still up (we never stop servers we did not start).
    config = httpx.get(f"{url}/api/v1/config", headers={"Authorization": f"Bearer {token}"}).json()
    assert config["values"]["group_size"] == 2
    status = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
    assert status["state"] == "stopped" and status["active"] is False
    report = (cli.studies / sid / "report.md").read_text()
    assert "Status:** stopped" in report and "No answer" in report
