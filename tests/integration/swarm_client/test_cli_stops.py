"""``swarm serve``, ``swarm worker`` and ``swarm run`` end within 10 s of SIGTERM whatever their peer
is doing, and leave no process behind (``support.stops``: checked with ``ps``). Real entry points
(``.venv/bin/swarm``), a real tiny-model server on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support import ROOT, ServeProcess, WorkerProcess, wait_for
from support.stops import terminate

SWARM_BIN = str(Path(sys.executable).parent / "swarm")
LETTERS = ROOT / "studies/examples/letters/client.py"


def _popen(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("SWARM_TOKEN", "SWARM_WORKER_TOKEN")}
    with open(log, "wb") as out:
        return subprocess.Popen(args, cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out,
                                stderr=subprocess.STDOUT)


def test_serve_worker_and_run_stop_within_10_s_whatever_their_peer_does(
        new_server: Callable[..., ServeProcess], tmp_path: Path) -> None:
    server = new_server()
    worker = WorkerProcess(server, "w1").start()
    worker.wait_ready()
    run_log = tmp_path / "run.log"
    run = _popen([SWARM_BIN, "run", str(LETTERS), "--server", server.url, "--state-dir", str(server.state_dir),
                  "--retry-for", "120"], run_log)
    events = _popen(["curl", "-sN", "-H", f"Authorization: Bearer {server.token}", f"{server.url}/api/v1/events"],
                    tmp_path / "events.log")
    try:
        wait_for(lambda: server.status()["episodes"]["finished"] >= 8, 120, what="the run's first episodes",
                 proc=run, log=run_log)

        # The worker's server hangs (SIGSTOP): the worker's leave gets no answer; it stops anyway.
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            took, code, _ = terminate(worker.process)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert code == 0 and "did not answer the leave" in worker.log(), worker.log()[-2000:]

        # The server stops with a study run and an event stream connected, and removes server.json.
        took, code, _kin = terminate(server.process)
        assert code == 0 and not (server.state_dir / "server.json").exists(), server.log()[-2000:]

        # The run's server is gone: it stops at once instead of retrying its calls for --retry-for.
        wait_for(lambda: "failed" in run_log.read_text(), 30, what="the run retrying its dead server", proc=run)
        took, code, _ = terminate(run)
        assert code == 130 and "interrupted" in run_log.read_text(), run_log.read_text()[-2000:]
        assert took < 6.0, took  # no call waits out its retry window
    finally:
        for proc in (run, events):
            proc.kill()
            proc.wait()
