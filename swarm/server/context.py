"""What every route needs, bundled once per app: settings, engine, device worker, keys, backend."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from swarm.backends.base import Backend
from swarm.server.auth import KeyRing
from swarm.server.batcher import DeviceWorker
from swarm.server.engine import Engine
from swarm.server.settings import ServerSettings


@dataclass
class AppContext:
    settings: ServerSettings
    backend: Backend
    worker: DeviceWorker
    engine: Engine
    keys: KeyRing
    max_context: int


def app_context(request: Request) -> AppContext:
    """FastAPI dependency: the context ``create_app`` stored on the app."""
    return request.app.state.ctx
