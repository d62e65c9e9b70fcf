"""What every route needs, bundled once per app: settings, engine, keys, the served context length."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from swarm.server.auth import KeyRing
from swarm.server.engine import Engine
from swarm.server.settings import ServerSettings


@dataclass
class AppContext:
    settings: ServerSettings
    engine: Engine
    keys: KeyRing
    max_context: int


def app_context(request: Request) -> AppContext:
    """FastAPI dependency: the context ``create_app`` stored on the app."""
    return request.app.state.ctx
