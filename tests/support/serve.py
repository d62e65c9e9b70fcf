"""Real ``swarm serve`` subprocesses on loopback: start, wait until ready, stop or crash; and
``swarm run`` of a study client against one.

``ServeProcess(port, state_dir, ...)`` is the one harness every test that needs a server *process*
uses (client, study, engine, reliability and researcher tests); tests of the server's insides run the
app in-process instead (``tests/swarm/server/server_harness.py``). Output goes to ``log_path``
(appended across restarts) for post-mortems; a start that fails or times out shows its tail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SWARM = [sys.executable, "-m", "swarm.cli"]
# A server's credentials and tracking come from its arguments and state dir, never from the test's shell.
_SCRUBBED_ENV = ("SWARM_TOKEN", "MLFLOW_TRACKING_URI")


@dataclass
class ServeProcess:
    """One ``swarm serve`` process. ``model=None`` passes no ``--model`` (the config file's ``model``
    decides, else swarm's default); ``given_token`` is passed as ``--token``, else the server reads or
    generates ``<state_dir>/token``; ``extra_args`` go last (``--threads 1``, ``--engine vllm``, ...)."""

    port: int
    state_dir: Path
    config: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()
    model: str | None = "tiny"
    given_token: str | None = None
    log_path: Path | None = None  # default: <state_dir>/serve.log
    cwd: Path = ROOT

    def __post_init__(self) -> None:
        self.log_path = self.log_path or self.state_dir / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return self.given_token or (self.state_dir / "token").read_text().strip()

    def start(self, timeout_s: float = 90.0) -> ServeProcess:
        """Start the process and wait until ``/healthz`` answers; a process that exits or a timeout
        fails the test with the log's tail, and never leaves a half-started server behind."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        args = [*SWARM, "serve", "--port", str(self.port), "--state-dir", str(self.state_dir)]
        if self.model is not None:
            args += ["--model", self.model]
        if self.given_token is not None:
            args += ["--token", self.given_token]
        if self.config is not None:
            args += ["--config", str(self.config)]
        args += list(self.extra_args)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        with open(self.log_path, "ab") as log:  # type: ignore[arg-type]
            self.process = subprocess.Popen(args, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                            env={**env, "PYTHONUNBUFFERED": "1"})
        return self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> ServeProcess:
        """Wait until ``/healthz`` answers (also for a ``process`` a test started itself)."""
        try:
            wait_for(self._healthy, timeout_s, what=f"the server on {self.url} to answer /healthz",
                     interval=0.1, proc=self.process, log=self.log_path)
        except BaseException:
            self.kill()
            raise
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1.0).is_success
        except httpx.TransportError:
            return False

    def http(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        """A client of the server's API with ``token`` (default: the server's own)."""
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def status(self) -> dict[str, Any]:
        """``GET /api/v1/status`` as JSON."""
        with self.http() as http:
            response = http.get("/api/v1/status")
            response.raise_for_status()
            return dict(response.json())

    def rss_mb(self) -> float:
        """Resident memory of the server process (Linux /proc)."""
        assert self.process is not None, "not started"
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown; a no-op if the process is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; a no-op if the process is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def stop_via_control(self, timeout: float = 60.0) -> int:
        """A graceful stop through ``POST /api/v1/control/stop``; the exit code."""
        assert self.process is not None, "not started"
        with self.http() as http:
            http.post("/api/v1/control/stop").raise_for_status()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        path = self.log_path
        return path.read_text(errors="replace") if path is not None and path.exists() else ""


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
