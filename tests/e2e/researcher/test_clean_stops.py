"""``researcher ui``, ``researcher start`` and ``researcher daemon`` end within 10 s of SIGTERM whatever
their peer is doing, and leave no process behind (``support.stops``: checked with ``ps``). Real entry
points (``.venv/bin/researcher``); the peer that hangs is an LLM endpoint that accepts connections
and never answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from support import free_port, wait_for
from support.stops import terminate

RESEARCHER_BIN = str(Path(sys.executable).parent / "researcher")


def _researcher(cli, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([RESEARCHER_BIN, *args], env=cli.env, cwd=cli.cwd, stdout=out,
                                stderr=subprocess.STDOUT)


@contextmanager
def _silent_llm() -> Iterator[tuple[str, list[socket.socket]]]:
    """An OpenAI-style endpoint that takes every connection and never answers (a provider that hangs);
    the connections it holds, one per planner call that reached it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept, name="silent-llm", daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1", held
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_ui_ends_mlflow_and_its_uvicorn(cli, tmp_path: Path) -> None:
    port = free_port()
    ui = _researcher(cli, "ui", "--port", str(port), "--artifacts-dir", str(cli.artifacts), log=tmp_path / "ui.log")

    def serving() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).is_success
        except httpx.TransportError:
            return False

    try:
        wait_for(serving, 120, what="the MLflow UI", proc=ui, log=tmp_path / "ui.log", interval=0.3)
        _took, code, kin = terminate(ui)
    finally:
        ui.kill()
        ui.wait()
    assert code == 0 and len(kin) >= 2, (code, kin)  # `mlflow ui` and the uvicorn it runs: both gone
    assert not serving()


def test_start_and_the_daemon_stop_while_the_llm_planner_hangs(cli, tmp_path: Path) -> None:
    """``researcher start`` stuck in a planner call ends on SIGTERM the way Ctrl-C ends it (resumable);
    the daemon then resumes that study on a schedule, and its SIGTERM ends that session too."""
    with _silent_llm() as (url, held):
        cli.env.update({"RESEARCHER_LLM_BASE_URL": url, "RESEARCHER_LLM_MODEL": "hung", "OPENAI_API_KEY": "sk-test"})
        log = tmp_path / "start.log"
        start = _researcher(cli, "start", "--topic", "Does a larger group size help on letters?", "--study-id",
                            "hung", "--budget", "10m", *cli.dirs, log=log)
        try:
            wait_for(lambda: held, 120, what="the planner's first call", proc=start, log=log)
            _, code, _ = terminate(start)
        finally:
            start.kill()
            start.wait()
        assert code == 130 and "researcher resume hung" in log.read_text(), log.read_text()[-2000:]

        scheduled = cli.run("schedule", "hung", "--cron", "* * * * * *", "--window", "1h", *cli.dirs)
        assert scheduled.returncode == 0, scheduled.stdout + scheduled.stderr
        log = tmp_path / "daemon.log"
        daemon = _researcher(cli, "daemon", "--poll", "1", "--port", "0", *cli.dirs, log=log)
        try:
            wait_for(lambda: len(held) >= 2, 120, what="the scheduled session's planner call", proc=daemon, log=log)
            _, code, kin = terminate(daemon)
        finally:
            daemon.kill()
            daemon.wait()
        assert code == 0 and any("resume hung --window" in cmd for cmd in kin.values()), (code, kin)
