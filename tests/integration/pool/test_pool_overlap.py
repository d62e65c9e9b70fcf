"""Async mode overlaps the push of a version to the workers with the next step's training: the step
waits only for the encoding, and each step's pool figures are those of the previous version's push
(``pool/disseminated_version``). A real server (the tiny model, async mode), one `swarm worker`
process and the letters client; the worker ends holding the newest version."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT, ServeProcess, WorkerProcess, free_port, study_run, wait_for

LETTERS = ROOT / "studies" / "examples" / "letters"
CONFIG = """group_size = 8
batch_groups = 2
min_group_size = 2
max_tokens = 16
mode = "async"
max_staleness = 2
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_async_pushes_overlap_the_next_step_and_the_worker_keeps_up(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=config).start()
    worker = WorkerProcess(server, "w")
    try:
        worker.start()
        worker.wait_ready()
        with study_run(LETTERS / "client.py", server, tmp_path / "run.log") as run:
            wait_for(lambda: server.status()["step"] >= 8, 240, what="step 8", proc=run)
        with server.http() as http:
            rows = http.get("/api/v1/metrics").json()
        # The last push finishes after its step: the worker holds the newest version soon after. The
        # client's last episodes may still train a step or two, so the newest version is read afresh.
        wait_for(lambda: (m := worker.member()) is not None and m["version"] == server.status()["policy_version"],
                 60, what=lambda: f"the worker at the newest version {server.status()['policy_version']} "
                                  f"({worker.member()})")
    finally:
        worker.stop()
        server.stop()
    pushed = [(r["policy_version"], r["metrics"]["pool/disseminated_version"]) for r in rows
              if "pool/disseminated_version" in r["metrics"]]
    print(f"(policy version, version whose push a step reports): {pushed}")
    assert len(pushed) >= 5, rows
    # A step reports a finished push: never its own version's before that push could end, and the
    # previous version's when the push ran on into the next step, as it does on loopback.
    assert all(version - 1 <= done <= version for version, done in pushed), pushed
    overlapped = sum(done == version - 1 for version, done in pushed)
    assert overlapped >= len(pushed) - 1, pushed
    assert all(r["metrics"]["perf/disseminate_bytes"] > 0 for r in rows if "perf/disseminate_bytes" in r["metrics"])
