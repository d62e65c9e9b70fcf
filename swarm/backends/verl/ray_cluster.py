"""Starting (or attaching to) Ray for the verl trainer, so that no Ray process outlives the server.

A local Ray started by ``ray.init()`` fate-shares with its starter through Linux's
``PR_SET_PDEATHSIG``: GCS, raylet and agents get SIGKILL when the *thread* that spawned them ends,
and Ray's worker processes exit when their raylet goes. That is what we want when the server is
killed (every thread ends, so the whole cluster goes with it, SIGKILL included), but it also means
a cluster started from a short-lived thread (a thread pool, ``asyncio.to_thread``) dies with that
thread and takes the server down. So ``LocalRay`` calls ``ray.init`` on a dedicated thread that
lives until ``close()``. No dashboard is started and the node address asked for is 127.0.0.1, but
Ray 2.60 itself widens that: ``ray.init`` resolves 127.0.0.1 to the machine's address and its gRPC
servers listen on all interfaces (measured with ``ss``; ``ray start --node-ip-address=127.0.0.1``
does the same). Keep such hosts behind a firewall, or use Ray's token authentication
(``RAY_AUTH_MODE=token``) outside tests.

Ray's fate-sharing leaves its dashboard and runtime-env agents alive long after a hard kill, so a
local cluster also gets a watchdog process (``_watchdog.py``) that SIGKILLs the server's Ray
processes once the server is gone.

With an address (``--ray-address``) the trainer only connects: the cluster is not ours to stop,
and its worker actors are ours to kill on ``close()`` (they die with the driver's job anyway, since
they are not detached). The ``swarm`` package is shipped to that cluster with the job
(``runtime_env`` ``py_modules``): remote nodes import the worker class and verl plugin from it, and
need only a Python with the project's dependencies (torch, verl 0.9.1), not a checkout.

GPUs: a local cluster declares only the trainer's GPUs (``num_gpus`` and ``CUDA_VISIBLE_DEVICES``
in the job's environment, which Ray maps its GPU slots onto), so the vLLM generator's devices are
never handed to a verl worker. An existing cluster keeps its own GPUs.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["LocalRay", "runtime_env"]


def runtime_env(address: str | None, env_vars: dict[str, str]) -> dict | None:
    """The job's ``runtime_env``: ``env_vars`` for every worker, and on a cluster we attach to, this
    ``swarm`` package (``py_modules``) so its nodes can import our worker code."""
    env: dict = {}
    if env_vars:
        env["env_vars"] = dict(env_vars)
    if address:
        import swarm

        env["py_modules"] = [str(Path(swarm.__file__).resolve().parent)]
    return env or None


class LocalRay:
    """A Ray connection owned by one trainer: ``start()`` it, ``close()`` it."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, env_vars: dict[str, str] | None = None,
                 gpus: tuple[str, ...] | None = None):
        """``gpus``: physical GPU ids a local cluster may use (None: whatever Ray detects)."""
        self.address = address
        self.num_cpus = num_cpus
        self.env_vars = dict(env_vars or {})
        self.num_gpus = None if gpus is None or address else len(gpus)
        if gpus is not None and not address:
            self.env_vars["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        self.started = False  # True when we started a local cluster (not when attached or reused)
        self.startup_s = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._connected = False
        self._watchdog: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        """Connect to ``address`` or start a local cluster; return when Ray is usable."""
        import ray

        if ray.is_initialized():  # someone in this process already owns a connection: share it
            logger.info("reusing the Ray connection already open in this process")
            return
        begin = time.perf_counter()
        self._thread = threading.Thread(target=self._own, name="ray-owner", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"Ray did not start within {timeout_s:.0f} s")
        if self._error is not None:
            raise RuntimeError(f"could not start Ray: {self._error}") from self._error
        self._connected = True
        if self.started:
            self._watchdog = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("_watchdog.py")), str(os.getpid())],
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.startup_s = time.perf_counter() - begin
        logger.info("Ray %s in %.1f s", "started" if self.started else "connected", self.startup_s)

    def _own(self) -> None:
        """Body of the owner thread: init Ray, then stay alive (fate-sharing is per thread)."""
        import ray

        env = runtime_env(self.address, self.env_vars)
        try:
            if self.address:
                ray.init(address=self.address, runtime_env=env, log_to_driver=False, configure_logging=False)
            else:
                ray.init(
                    num_cpus=self.num_cpus,
                    num_gpus=self.num_gpus,
                    include_dashboard=False,
                    _node_ip_address="127.0.0.1",
                    runtime_env=env,
                    log_to_driver=False,
                    configure_logging=False,
                )
                self.started = True
        except Exception as exc:  # re-raised by start() in the caller's thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._stop.wait()

    def close(self) -> None:
        """Disconnect; stops the local cluster if we started it. Idempotent."""
        if not self._connected:
            return
        import ray

        try:
            ray.shutdown()
        finally:
            self._connected = False
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10)
            if self._watchdog is not None:
                self._watchdog.terminate()
                self._watchdog.wait(timeout=10)
                self._watchdog = None
