"""Real processes a test starts and owns: ``swarm serve`` (start, wait until ready, stop or crash),
``swarm worker`` joining one, ``swarm run`` of a study client against one, and any other script a test
needs as a process it can SIGKILL.

``ServeProcess(port, state_dir, ...)`` is the one harness every test that needs a server *process*
uses (client, study, engine, reliability, pool and researcher tests); tests of the server's insides run
the app in-process instead (``tests/integration/swarm_server/server_harness.py``). ``WorkerProcess`` is the same for
``swarm worker``, and ``ManagedProcess`` what both are built on: output appended to ``log_path`` (across
restarts) for post-mortems, ``kill`` a crash (SIGKILL), ``stop`` a clean end (SIGTERM, then SIGKILL
after a grace period); a start that fails or times out shows the log's tail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support.waiting import wait_for
from swarm.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SWARM = [sys.executable, "-m", "swarm.cli"]
# A swarm process's credentials and tracking come from its arguments and state dir, never from the test's shell.
_SCRUBBED_ENV = ("SWARM_TOKEN", "SWARM_WORKER_TOKEN", "MLFLOW_TRACKING_URI")


class ManagedProcess:
    """A process a test started and must not leave behind: ``launch`` it with its output appended to
    ``log_path``; ``kill`` is a crash, ``stop`` a clean end. Used as is for a script of the test's own
    (``ManagedProcess(log_path).launch([...])``) and as the base of ``ServeProcess`` and ``WorkerProcess``."""

    stop_grace_s = 15.0  # what ``stop()`` waits after SIGTERM before it SIGKILLs
    cwd: Path = ROOT
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def __init__(self, log_path: Path, cwd: Path = ROOT) -> None:
        self.log_path, self.cwd, self.process = log_path, cwd, None

    def launch(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> ManagedProcess:
        """Start ``args`` in ``cwd`` (returns at once), with the test's environment minus swarm's
        credentials and tracking, plus ``env``; stdout and stderr go to ``log_path``."""
        base = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        with open(self.log_path, "ab") as log:  # type: ignore[arg-type]
            self.process = subprocess.Popen(list(args), cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                            env={**base, "PYTHONUNBUFFERED": "1", **(env or {})})
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown; a no-op if the process is gone."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            self.process.wait(timeout=30)  # type: ignore[union-attr]

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (default ``stop_grace_s``); a no-op if the process is gone."""
        if self.alive():
            self.process.terminate()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=self.stop_grace_s if grace_s is None else grace_s)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_exit(self, timeout: float, what: str = "the process to exit") -> int:
        """The exit code of a process that must end by itself (a start that is refused); one still
        running after ``timeout`` fails the test with the log's tail and is killed."""
        assert self.process is not None, "not started"
        try:
            wait_for(lambda: self.process.poll() is not None, timeout,  # type: ignore[union-attr]
                     what=what, interval=0.1, log=self.log_path)
        finally:
            self.kill()
        return self.process.returncode

    def log(self) -> str:
        path = self.log_path
        return path.read_text(errors="replace") if path is not None and path.exists() else ""

    def rss_mb(self) -> float:
        """Resident memory of the process (Linux /proc)."""
        assert self.process is not None, "not started"
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")


@dataclass
class ServeProcess(ManagedProcess):
    """One ``swarm serve`` process. ``model=None`` passes no ``--model`` (the config file's ``model``
    decides, else swarm's default); ``given_token`` is passed as ``--token``, else the server reads or
    generates ``<state_dir>/token``; ``extra_args`` go last (``--threads 1``, ``--engine vllm``, ...);
    ``env`` is added to the process's environment."""

    port: int
    state_dir: Path
    config: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()
    model: str | None = "tiny"
    given_token: str | None = None
    log_path: Path | None = None  # default: <state_dir>/serve.log
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_path = self.log_path or self.state_dir / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return self.given_token or (self.state_dir / "token").read_text().strip()

    def args(self) -> list[str]:
        args = [*SWARM, "serve", "--port", str(self.port), "--state-dir", str(self.state_dir)]
        if self.model is not None:
            args += ["--model", self.model]
        if self.given_token is not None:
            args += ["--token", self.given_token]
        if self.config is not None:
            args += ["--config", str(self.config)]
        return args + list(self.extra_args)

    def launch_serve(self) -> ServeProcess:
        """Start the process and return at once (``start`` also waits until it is ready)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.launch(self.args(), self.env)
        return self

    def start(self, timeout_s: float = 90.0) -> ServeProcess:
        """Start the process and wait until ``/healthz`` answers; a process that exits or a timeout
        fails the test with the log's tail, and never leaves a half-started server behind."""
        return self.launch_serve().wait_ready(timeout_s)

    def run_refused(self, timeout_s: float = 120.0) -> int:
        """Start a server that must refuse to start; its exit code (the reason is in ``log()``)."""
        return self.launch_serve().wait_exit(timeout_s, what=f"the server on {self.url} to refuse to start")

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


@dataclass
class WorkerProcess(ManagedProcess):
    """One ``swarm worker --engine <engine>`` joining ``server`` with the server's worker token file
    (state and work dir under the server's state dir, log in ``<state_dir>/worker-<name>.log``)."""

    server: ServeProcess
    name: str
    extra_args: tuple[str, ...] = ()
    engine: str = "torch"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    stop_grace_s = 30.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:  # type: ignore[override]
        return self.server.state_dir / f"worker-{self.name}.log"

    def start(self) -> WorkerProcess:
        """Start the process and return at once (``wait_ready`` waits until the server lists it ready)."""
        self.launch([*SWARM, "worker", "--server", self.server.url, "--engine", self.engine, "--port", str(self.port),
                     "--state-dir", str(self.server.state_dir), "--work-dir", str(self.server.state_dir / self.name),
                     *self.extra_args])
        return self

    def member(self) -> dict[str, Any] | None:
        """The server's status entry for this worker (by address), if it is listed."""
        return next((w for w in self.server.status()["workers"] if w["address"] == self.url), None)

    def wait_ready(self, timeout_s: float = 120.0) -> dict[str, Any]:
        return wait_for(lambda: (m := self.member()) is not None and m["state"] == "ready" and m, timeout_s,
                        what=f"worker {self.name} ready", interval=0.2, proc=self.process, log=self.log_path)


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
