"""A free TCP port for a process that binds it later: one the kernel never hands out by itself.

Binding port 0 finds a free port in the kernel's ephemeral range, and the kernel gives that port out
again to the next socket that binds port 0 or connects anywhere. A child that binds the port seconds
later (a vLLM child after its imports, a run's ``swarm serve``) can then find it taken or, worse,
shared: vLLM binds with ``SO_REUSEADDR`` before it listens, and a server that another process
started on port 0 in between held the same port and answered the child's health checks (a CI run).
A port outside the ephemeral range is never chosen by the kernel; only a process that names it can
take it, and the ports here are drawn at random (from the OS, not a seeded generator: two servers
with one ``--seed`` would draw the same) and checked free.

Standard library only; used by ``swarm`` and ``researcher`` alike.
"""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

__all__ = ["ephemeral_range", "free_port"]

_LOWEST = 10_000  # below: ports that well-known services tend to use
_TRIES = 50
_draw = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel chooses from for port 0 and outgoing connections (inclusive)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return (49152, 65535) if sys.platform == "darwin" else (32768, 60999)  # the systems' defaults
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free now, outside the ephemeral range where there is room (else one
    the kernel picks). Another process that names the same port can still take it first: rare, and
    the caller's start-up check (a health probe) must still fail clearly then."""
    low, high = ephemeral_range()
    below, above = max(0, low - _LOWEST), max(0, 65535 - high)
    if below + above:
        for _ in range(_TRIES):
            index = _draw.randrange(below + above)
            port = _LOWEST + index if index < below else high + 1 + index - below
            if _bindable(host, port):
                return port
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    """Free for a listener now: binds without ``SO_REUSEADDR`` (so a port in TIME_WAIT counts as taken)."""
    with socket.socket(_family(host)) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
