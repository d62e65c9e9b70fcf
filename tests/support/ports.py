"""A TCP port on loopback for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the kernel picks it; another process may
    still take it before the server binds, which on loopback in a test run practically never happens)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
