"""Deprecated since 0.1: ``load_engines`` is ``swarm.local.roles.load_roles`` (it loads a process's
generator and trainer roles; "engine" names ``--engine``'s choice). Kept for one release."""

from __future__ import annotations

import warnings

from swarm.local.roles import load_roles

warnings.warn("swarm.local.engines.load_engines is now swarm.local.roles.load_roles; the old path goes in the next "
              "release", DeprecationWarning, stacklevel=2)

load_engines = load_roles

__all__ = ["load_engines"]
