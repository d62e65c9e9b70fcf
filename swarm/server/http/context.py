"""What every route needs, bundled once per app: settings, the core (claims, control), its
episode lifecycle and chat completions, keys, the served context length, the pool's roster. Routes reach the server
through this only."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from swarm.config import ServerSettings
from swarm.pool.roster import Roster
from swarm.server.auth import KeyRing
from swarm.server.core import ServerCore
from swarm.server.episodes.completions import Completions
from swarm.server.episodes.lifecycle import Lifecycle
from swarm.server.episodes.runs import RunEpisodes


@dataclass
class AppContext:
    settings: ServerSettings
    core: ServerCore  # claims, control, status
    lifecycle: Lifecycle  # heartbeats, finishes, aborts
    chat: Completions  # chat completions
    runs: RunEpisodes  # run keys' episodes, and the episode each response id names
    keys: KeyRing
    max_context: int
    roster: Roster | None = None  # the generator pool's membership (``swarm worker`` processes)


def app_context(request: Request) -> AppContext:
    """FastAPI dependency: the context ``create_app`` stored on the app."""
    return request.app.state.ctx
