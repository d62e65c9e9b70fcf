"""``run_worker``: a ``swarm worker`` process — build the engine, serve, leave cleanly on SIGTERM.

The engine comes from the same factory ``swarm serve`` uses (``swarm.local.roles.load_roles``): torch
is the in-process sampler on a ``DeviceWorker`` thread behind a ``LocalGenerator``; vllm is the vLLM
generator (a child process fed token ids; weights reach it from disk). The weights it starts with do
not matter: nothing is served before the server's current version is loaded.

SIGTERM/SIGINT: the worker leaves the pool (the server stops routing to it), gives running calls a
few seconds to finish, then uvicorn shuts down, all within ``swarm.stopping``'s deadline (a server
that does not answer the leave is not waited for); a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from types import FrameType

import uvicorn

from swarm import stopping
from swarm.backends.base import Generator
from swarm.config import ServerConfig, ServerSettings
from swarm.local.device_worker import DeviceWorker
from swarm.local.generator import LocalGenerator
from swarm.local.roles import load_roles
from swarm.pool.worker import WorkerNode, WorkerOptions, worker_app

log = logging.getLogger(__name__)

# SIGTERM to exit within swarm.stopping's deadline: the leave (running calls finish), then uvicorn's shutdown.
_LEAVE_GRACE_S = 3.0
_GRACEFUL_S = 2


def build_generator(engine: str, model: str, state_dir: Path, *, seed: int, capacity: int,
                    vllm_python: str | None = None) -> tuple[Generator, DeviceWorker | None]:
    """The worker's generator (and the device thread a torch one runs on)."""
    config = ServerConfig(max_batch_rows=min(capacity, 4096))
    settings = ServerSettings(model=model, engine="vllm" if engine == "vllm" else "torch", trainer="torch",
                              state_dir=state_dir, seed=seed, weight_transfer="disk", vllm_python=vllm_python,
                              config=config)
    backend, generator, _ = load_roles(settings)
    if generator is not None:
        return generator, None
    if backend is None:  # load_roles builds the torch backend for a torch engine
        raise ValueError(f"no engine {engine!r}")
    device = DeviceWorker(backend, window_s=0.005, max_rows=capacity)
    device.start()
    return LocalGenerator(backend, device), device


def run_worker(options: WorkerOptions, generator: Generator, *, host: str, port: int) -> None:
    """Serve until SIGTERM (leaving the pool first) or a second signal."""
    node = WorkerNode(generator, options)
    server = _WorkerServer(uvicorn.Config(worker_app(node), host=host, port=port, log_level="warning",
                                          timeout_graceful_shutdown=_GRACEFUL_S, timeout_keep_alive=75), node, host)
    server.run()


class _WorkerServer(uvicorn.Server):
    """uvicorn, which tells the node its bound address once listening and turns the first signal
    into a clean leave."""

    def __init__(self, config: uvicorn.Config, node: WorkerNode, host: str) -> None:
        super().__init__(config)
        self.node = node
        self.host = host
        self._leaving: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:
            return
        port = next((s.getsockname()[1] for srv in getattr(self, "servers", []) for s in srv.sockets), None)
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        if self.node.address is None:
            self.node.address = f"http://{host}:{port}"
        log.info("swarm worker listening on %s:%s (advertised as %s)", self.host, port, self.node.address)
        self.node.listening.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first SIGTERM/SIGINT leaves the pool, then shuts down, within ``swarm.stopping``'s
        deadline; a second exits at once. The signal is not raised again after the shutdown (uvicorn's
        own handler does, which ended the process by the signal instead of by its exit code)."""
        stopping.on_stop_signal(sig)
        if self._leaving is None:
            self._leaving = asyncio.get_event_loop().create_task(self._leave_then_exit())

    async def _leave_then_exit(self) -> None:
        log.info("leaving the pool: no new calls; running ones get %.0f s to finish", _LEAVE_GRACE_S)
        try:
            await asyncio.wait_for(self.node.leave(grace_s=_LEAVE_GRACE_S), _LEAVE_GRACE_S + 1.0)
        except TimeoutError:
            log.warning("the server did not answer the leave in time: stopping anyway")
        finally:
            self.should_exit = True
