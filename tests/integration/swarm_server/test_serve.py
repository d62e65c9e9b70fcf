"""``serve(settings)`` as a real process: token file, server.json, ready log, graceful stop."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import httpx
import pytest
from support import ManagedProcess, wait_for

from swarm.server import ServerSettings, serve


def test_refuses_public_bind_without_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without a token"):
        serve(ServerSettings(host="0.0.0.0", port=0, state_dir=tmp_path, model="does-not-matter"))
    assert not (tmp_path / "token").exists()


@pytest.mark.slow
def test_serve_writes_token_and_stops_gracefully(tiny_model: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "from swarm.server import serve, ServerSettings; "
        f"serve(ServerSettings(model={str(tiny_model)!r}, port=0, state_dir={str(state)!r}))"
    )
    env = {"OMP_NUM_THREADS": "1"}  # see conftest: one torch thread on a shared machine
    server = ManagedProcess(tmp_path / "serve.log").launch([sys.executable, "-c", code], env=env)
    proc = server.process
    assert proc is not None
    try:
        wait_for((state / "server.json").exists, 90, what="the server to come up (server.json)", interval=0.1,
                 proc=proc, log=server.log_path)
        info = json.loads((state / "server.json").read_text())
        assert info["pid"] == proc.pid and info["url"].startswith("http://127.0.0.1:")
        token_file = state / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((state / "secret").stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        with httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            assert http.get("/healthz").json()["ok"] is True
            assert http.get("/api/v1/status").json()["state"] == "running"
            stopped = http.post("/api/v1/control/stop").json()
        assert stopped["state"] == "stopping" and stopped["detail"]["shutting_down"] is True
        assert proc.wait(timeout=30) == 0
        assert (state / "checkpoints" / "step-0").is_dir()
        assert not (state / "server.json").exists()
        assert "ready" in server.log()
    finally:
        server.kill()
