"""Real ``swarm serve`` processes for the reliability tests and the load benchmark.

``ServerProcess.start(model, state_dir, port, token, config)`` runs ``python -m swarm.cli serve`` with
a TOML config, waits until ``/healthz`` answers, and can be SIGKILLed (``kill``) or stopped through
the control API (``stop``). Output goes to ``<state_dir>/server-<n>.log`` for post-mortems.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toml(config: dict[str, Any]) -> str:
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    state_dir: Path
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, model: Path | str, state_dir: Path, *, port: int, token: str | None = "rel-token",
              config: dict[str, Any] | None = None, timeout: float = 150.0,
              extra_args: tuple[str, ...] = ()) -> ServerProcess:
        """``token=None``: no ``--token``; the server reads or generates ``<state_dir>/token``."""
        state_dir.mkdir(parents=True, exist_ok=True)
        config_file = state_dir / "rel-config.toml"
        config_file.write_text(_toml(config or {}))
        n = len(list(state_dir.glob("server-*.log")))
        log_path = state_dir / f"server-{n}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "swarm.cli", "serve", "--model", str(model), "--port", str(port),
                 "--state-dir", str(state_dir), *(["--token", token] if token else []), "--config", str(config_file),
                 "--threads", "1", *extra_args],
                stdout=log_file, stderr=subprocess.STDOUT, env=env)
        server = cls(proc=proc, url=f"http://127.0.0.1:{port}", token=token or "", state_dir=state_dir,
                     log_path=log_path)
        try:
            server.wait_ready(timeout)
            server.token = server.token or (state_dir / "token").read_text().strip()
        except BaseException:
            server.kill()  # never leave a half-started server behind
            raise
        return server

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout} s:\n{self.log_path.read_text()[-3000:]}")

    def http(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def status(self) -> dict[str, Any]:
        with self.http() as http:
            response = http.get("/api/v1/status")
            response.raise_for_status()
            return dict(response.json())

    def rss_mb(self) -> float:
        """Resident memory of the server process (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")

    def kill(self) -> None:
        """SIGKILL (a crash); no-op if already gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60.0) -> int:
        """Graceful stop through the control API; returns the exit code."""
        with self.http() as http:
            http.post("/api/v1/control/stop").raise_for_status()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
