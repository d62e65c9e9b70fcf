"""``serve(settings)``: build the generator and trainer, resolve the token, and run uvicorn until stopped.

Writes ``<state_dir>/server.json`` (url, pid, model) so tools can find a running server, and
``<state_dir>/token`` when the token was generated. On an existing state dir the server resumes (see
``swarm.server.durability.recovery``): the latest checkpoint's weights and step, the episodes finished but not
yet trained, and the live config as last patched — the ``--config`` values only seed a fresh state
dir, so a restart never silently undoes a ``PATCH /api/v1/config``. Use a new ``--state-dir`` (or
``swarm config`` after the restart) to change settings. Torch thread counts are the CLI's business;
nothing here imports torch.

Errors that must end ``swarm serve`` with one clear line (the CLI exits with code 2) are raised as
``ValueError``: a state dir whose ``buffer.db`` is not a swarm buffer (checked before the slow model
load), checkpoints none of which loads (``swarm.server.durability.recovery``), a generator that does not come
up, and a ``stop`` whose final checkpoint failed (the server still exits, within the graceful
shutdown, but not with code 0: the state dir lacks the checkpoint the caller asked for).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from swarm import stopping
from swarm.atomic import write_atomic
from swarm.config import ServerSettings
from swarm.local.roles import load_roles
from swarm.server.app import create_app
from swarm.server.auth import resolve_token
from swarm.server.durability.diskspace import RETRY_AFTER_S, is_disk_full
from swarm.server.durability.store import EpisodeStore

log = logging.getLogger(__name__)

# Longer than clients keep idle pooled connections (httpx: 5 s), so a client never reuses a
# connection in the instant the server closes it (uvicorn's 5 s default raced exactly that way
# under load: a "connection error" that was nobody's fault).
_KEEP_ALIVE_S = 75
_GRACEFUL_S = 4  # open requests get this long after SIGTERM; the generator's and trainer's own stop fits the rest


def serve(settings: ServerSettings) -> None:
    """Run a swarm server in this process until ``stop`` or a signal. Raises ``ValueError`` for
    settings or a state dir that must not run (a non-loopback host without a token, a damaged
    buffer, no loadable checkpoint) and after a stop whose final checkpoint failed."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    token = resolve_token(settings.host, settings.token, settings.state_dir)  # refuse before loading a model
    settings = settings.model_copy(update={"token": token})
    EpisodeStore(settings.state_dir / "buffer.db").close()  # a damaged buffer fails before the model loads
    backend, generator, trainer = load_roles(settings)
    app = create_app(settings, backend, generator=generator, trainer=trainer)
    # log_config=None: uvicorn's records go through the handlers the entry point set up (a --log-file too).
    server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", log_config=None,
                                    timeout_graceful_shutdown=_GRACEFUL_S, timeout_keep_alive=_KEEP_ALIVE_S), settings)
    app.state.request_shutdown = server.request_exit
    try:
        server.run()
    finally:
        (settings.state_dir / "server.json").unlink(missing_ok=True)
    if app.state.startup_error is not None:
        raise ValueError(f"the server could not start: {app.state.startup_error}")
    exit_error = getattr(app.state, "exit_error", None)  # set by a stop whose checkpoint failed
    if exit_error is not None:
        raise ValueError(exit_error)


class _Server(uvicorn.Server):
    """uvicorn's server, announcing its bound URL once listening (port 0 picks a free port)."""

    def __init__(self, config: uvicorn.Config, settings: ServerSettings) -> None:
        super().__init__(config)
        self.settings = settings

    def request_exit(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: a graceful shutdown within ``swarm.stopping``'s deadline (a second signal
        exits at once). Unlike uvicorn's own handler this one does not raise the signal again once the
        shutdown is done, which killed the process before ``serve`` removed server.json."""
        stopping.on_stop_signal(sig)
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.should_exit:  # binding failed; uvicorn reports it
            return
        url = f"http://{_display_host(self.settings.host)}:{_bound_port(self, self.settings.port)}"
        info = {"url": url, "pid": os.getpid(), "model": self.settings.model, "started": time.time()}
        if await announce(self.settings.state_dir / "server.json", info, lambda: self.should_exit):
            log.info("ready: swarm server for %s at %s", self.settings.model, url)


async def announce(path: Path, info: dict[str, object], stopping_now: Callable[[], bool]) -> bool:
    """Write ``server.json`` whole (a temporary file renamed over it). On a full disk, wait for room
    rather than exit: the generator and trainer are up (vLLM's start alone takes minutes on a busy CPU) and the
    server already answers, reporting the full disk; a full disk is a state, not a crash (the soak
    found a server exiting here). False if the server stopped first."""
    waiting = False
    while not stopping_now():
        try:
            write_atomic(path, json.dumps(info, indent=2))  # a refused write leaves no temporary file
            return True
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if not waiting:
                log.warning("disk full: cannot write %s (%s); retrying every %.0f s", path, exc, RETRY_AFTER_S)
                waiting = True
            await asyncio.sleep(RETRY_AFTER_S)
    return False


def _bound_port(server: uvicorn.Server, requested: int) -> int:
    for listener in getattr(server, "servers", []):
        for sock in getattr(listener, "sockets", []):
            return int(sock.getsockname()[1])
    return requested


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
