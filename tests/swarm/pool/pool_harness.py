"""Real ``swarm worker`` processes for the pool tests: start one against a ``ServeProcess``, kill it
(SIGKILL: a crash) or stop it (SIGTERM: a clean leave), and read the server's view of its members."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import SWARM, ServeProcess, free_port, wait_for

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class WorkerProcess:
    """One ``swarm worker --engine <engine>`` joining ``server`` with the server's worker token file."""

    server: ServeProcess
    name: str
    extra_args: tuple[str, ...] = ()
    engine: str = "torch"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.server.state_dir / f"worker-{self.name}.log"

    def start(self) -> WorkerProcess:
        args = [*SWARM, "worker", "--server", self.server.url, "--engine", self.engine, "--port", str(self.port),
                "--state-dir", str(self.server.state_dir), "--work-dir", str(self.server.state_dir / self.name),
                *self.extra_args]
        env = {k: v for k, v in os.environ.items() if k != "SWARM_WORKER_TOKEN"}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            env={**env, "PYTHONUNBUFFERED": "1"})
        return self

    def member(self) -> dict[str, Any] | None:
        """The server's status entry for this worker (by address), if it is listed."""
        return next((w for w in self.server.status()["workers"] if w["address"] == self.url), None)

    def wait_ready(self, timeout_s: float = 120.0) -> dict[str, Any]:
        return wait_for(lambda: (m := self.member()) is not None and m["state"] == "ready" and m, timeout_s,
                        what=f"worker {self.name} ready", interval=0.2, proc=self.process, log=self.log_path)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, grace_s: float = 30.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
