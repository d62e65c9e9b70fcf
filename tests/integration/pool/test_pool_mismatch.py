"""Untrusted workers: a worker that serves another model (its own random initialisation, while it
reports every published version) is drained by the per-member log-prob mismatch bound; an honest
worker and the server's own generator, whose samples the trainer reproduces exactly, keep serving."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support import ROOT, ManagedProcess, ServeProcess, WorkerProcess, free_port, study_run, wait_for

LETTERS = ROOT / "studies" / "examples" / "letters"
ROGUE = Path(__file__).with_name("rogue_worker.py")
CONFIG = """group_size = 8
batch_groups = 2
min_group_size = 2
max_tokens = 16
mode = "sync"
max_worker_logprob_diff = 0.05
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_serving_another_model_is_drained(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=config).start()
    honest = WorkerProcess(server, "honest")
    rogue_port = free_port()
    rogue_url = f"http://127.0.0.1:{rogue_port}"
    rogue = ManagedProcess(tmp_path / "rogue.log")
    try:
        honest.start()
        rogue.launch([sys.executable, str(ROGUE), "--server", server.url, "--port", str(rogue_port),
                      "--state-dir", str(server.state_dir)], env={"PYTHONPATH": str(ROOT)})
        honest.wait_ready()

        def member(url: str) -> dict | None:
            return next((w for w in server.status()["workers"] if w["address"] == url), None)

        wait_for(lambda: (m := member(rogue_url)) is not None and m["state"] == "ready", 120,
                 what="the rogue worker ready", proc=rogue.process, log=rogue.log_path)
        with study_run(LETTERS / "client.py", server, tmp_path / "run.log"):
            drained = wait_for(lambda: (m := member(rogue_url)) is not None and m["state"] == "draining" and m,
                               240, what=lambda: f"the rogue drained (workers: {server.status()['workers']})")
        workers = {w["id"]: w for w in server.status()["workers"]}
        kept = member(honest.url)
    finally:
        rogue.kill()
        honest.stop()
        server.stop()
    assert drained["logprob_diff_max"] > 0.05
    assert workers["local"]["state"] == "ready" and kept is not None and kept["state"] == "ready"
    for sound in (workers["local"], kept):  # the trainer reproduces their log-probs (when it saw their samples)
        assert sound["logprob_diff_max"] is None or sound["logprob_diff_max"] < 0.05, sound
