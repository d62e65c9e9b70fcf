"""``serve(settings)`` as a real process: token file, server.json, ready log, graceful stop."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

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
    env = dict(os.environ, OMP_NUM_THREADS="1")  # see conftest: one torch thread on a shared machine
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while not (state / "server.json").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.1)
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
        assert "ready" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
