"""The box's one way out: its server's port, handed in through a listening socket.

The box has its own network namespace with nothing but loopback. Before the client starts,
``swarm.box._inside`` opens a listening TCP socket on ``127.0.0.1:<server port>`` *inside* that
namespace and passes its file descriptor out (``SCM_RIGHTS`` over a socket pair bubblewrap
inherited). ``Forwarder`` accepts on it from outside, in ``swarm run --box``'s own process, and joins
each connection to the real server: one hop, no extra process, and no other address or port exists
for the client (a connect to any other port is refused by the empty namespace; UDP, raw sockets,
abstract Unix sockets and DNS reach nothing).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

log = logging.getLogger(__name__)
__all__ = ["Forwarder", "receive_listener", "send_listener"]

_CHUNK = 1 << 16


def send_listener(handoff_fd: int, port: int) -> None:
    """Inside the box: listen on loopback ``port`` and pass the socket out through ``handoff_fd``."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    with socket.socket(fileno=handoff_fd) as handoff:
        socket.send_fds(handoff, [b"L"], [listener.fileno()])
    listener.close()  # the forwarder holds it now; the client cannot accept on it


def receive_listener(handoff: socket.socket, timeout_s: float) -> socket.socket | None:
    """Outside: the listening socket the box passed out (None if the box ended or sent none in time)."""
    handoff.settimeout(timeout_s)
    try:
        _, fds, _, _ = socket.recv_fds(handoff, 16, 1)
    except (OSError, TimeoutError):
        return None
    return socket.socket(fileno=fds[0]) if fds else None


class Forwarder:
    """Accept connections on ``listener`` (in the box's namespace) and join each to ``target``."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]) -> None:
        self._listener, self._target = listener, target
        self._thread = threading.Thread(target=self._accept, name="box-forward", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                inner, _ = self._listener.accept()
            except OSError:
                return  # closed: the box ended
            try:
                outer = socket.create_connection(self._target, timeout=30.0)
            except OSError as exc:
                log.warning("box: cannot reach the server at %s:%s: %s", *self._target, exc)
                inner.close()
                continue
            outer.settimeout(None)
            for sock in (inner, outer):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((inner, outer), (outer, inner)):
                threading.Thread(target=_pump, args=(src, dst), name="box-pump", daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then pass the end on (half-close) or drop both."""
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    try:
        while (n := src.recv_into(buffer)) > 0:
            dst.sendall(view[:n])
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        # Each socket is closed by the pump that reads it, once that side has ended.
        src.close()
