"""Real ``swarm serve`` / ``swarm run`` subprocesses for client and study tests: start, wait, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
SWARM = [sys.executable, "-m", "swarm.cli"]


@dataclass
class ServeProcess:
    """One ``swarm serve --model tiny`` process; ``url``, its ``state_dir`` and log file. ``model=None``
    passes no ``--model``: the config file's ``model`` decides (else swarm's default)."""

    port: int
    state_dir: Path
    config: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()
    model: str | None = "tiny"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    def start(self, timeout_s: float = 90.0) -> ServeProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        args = [*SWARM, "serve", "--port", str(self.port), "--state-dir", str(self.state_dir)]
        if self.model is not None:
            args += ["--model", self.model]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += list(self.extra_args)
        log = open(self.state_dir / "serve.log", "ab")
        env = {k: v for k, v in os.environ.items() if k not in ("SWARM_TOKEN", "MLFLOW_TRACKING_URI")}
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"swarm serve exited with {self.process.returncode}: {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).is_success:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"swarm serve not ready after {timeout_s} s: {self.log()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        path = self.state_dir / "serve.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def study_run(client_py: Path, server: ServeProcess, log_path: Path,
              args: tuple[str, ...] = ()) -> Iterator[subprocess.Popen]:
    """``swarm run client_py [args]`` against ``server`` as a real process, output in ``log_path``; on
    exit it gets SIGINT (the CLI finishes in-flight episodes and exits), then SIGKILL after 30 s."""
    with open(log_path, "wb") as log:
        run = subprocess.Popen([*SWARM, "run", str(client_py), "--server", server.url,
                                "--state-dir", str(server.state_dir), *args], cwd=ROOT, stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            yield run
        finally:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
