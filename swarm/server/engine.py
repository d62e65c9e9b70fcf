"""Deprecated since 0.1: the server's core is ``swarm.server.core.ServerCore``. "Engine" names the
inference engines of ``--engine torch|vllm``; this path keeps ``Engine`` working for one release."""

from __future__ import annotations

import warnings

from swarm.server.core import ServerCore

warnings.warn("swarm.server.engine.Engine is now swarm.server.core.ServerCore; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)

Engine = ServerCore

__all__ = ["Engine"]
