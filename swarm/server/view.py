"""``ServerView``: what the server core's parts may read of it, and where they report.

The ``ServerCore`` owns the server's mutable state and hands each part (claims, held-out evaluation,
chat completions, the step loop) its collaborators explicitly, as objects; what changes while the
server runs (the live config, the policy version and step served, a pause) the parts read through this
small read-only view instead of a reference to the whole core. It is a ``Protocol``: the core
satisfies it, and a test can pass any object with these members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from swarm.config import ServerConfig

__all__ = ["LiveConfig", "ServerView"]


@dataclass
class LiveConfig:
    """The server's live config, one cell: ``PATCH /api/v1/config`` (``ServerCore.patch_config``)
    replaces ``config`` and counts ``version``. What is built before the core reads it here: the
    generator pool's routing, its roster, the event stream's reader cap."""

    config: ServerConfig
    version: int = 0


class ServerView(Protocol):
    """The live values the parts read, the clock, and the event sink."""

    @property
    def config(self) -> ServerConfig:
        """The live config (replaced by every ``PATCH /api/v1/config``)."""

    @property
    def config_version(self) -> int: ...

    @property
    def policy_version(self) -> int:
        """The trainer's newest version; never goes back."""

    @property
    def step(self) -> int:
        """The last committed training step."""

    @property
    def paused(self) -> bool:
        """Paused by ``POST /api/v1/control/pause``: no claims and no new steps until resumed."""

    def clock(self) -> float:
        """Wall-clock seconds (``time.time`` unless a test injects another)."""

    def emit(self, type_: str, **data: Any) -> None:
        """Publish a server event (``episode.*``, ``step.*``, ``weights.*``, ``error``, …)."""
