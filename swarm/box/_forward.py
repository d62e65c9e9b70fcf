"""The box's one way out: its server's port, reached through connections made outside and handed in.

The box has its own network namespace with nothing but loopback: a connect to any address or port there
is refused, and UDP, raw sockets, abstract Unix sockets and DNS reach nothing. Two ways lead to the server,
both over the socket pair bubblewrap inherited (the hand-off), both decided outside, in ``swarm run
--box``'s own process:

- **Handed-in connections** (the fast path). ``swarm.box._inside`` replaces ``socket.create_connection``
  for the server's address (``127.0.0.1:<port>``, the URL the boxed client is given): it asks the
  ``Broker`` outside with one byte, and the broker connects to the real server and passes the connected
  socket in (``SCM_RIGHTS``). The client's bytes then flow to the server with no hop: the box costs a
  letters run nothing per request. Synchronous HTTP clients (httpx's and so openai's, ``swarm.client``)
  connect this way.
- **A forwarded port** (every other way of connecting, e.g. an asyncio client). Before the client starts,
  ``swarm.box._inside`` opens a listening socket on ``127.0.0.1:<port>`` inside the namespace and passes it
  out; the ``Forwarder`` accepts on it and joins each connection to the server, two threads a connection.

Either way the box never names a destination: the only address it can reach is the one outside chose.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

log = logging.getLogger(__name__)
__all__ = ["Broker", "Forwarder", "install_connector", "receive_listener", "send_listener"]

_CHUNK = 1 << 16
_ASK, _GIVEN, _REFUSED = b"C", b"K", b"E"


def send_listener(handoff_fd: int, port: int) -> socket.socket:
    """Inside the box: listen on loopback ``port`` and pass the socket out through ``handoff_fd``; the
    hand-off, kept open for ``install_connector``."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    handoff = socket.socket(fileno=handoff_fd)
    handoff.set_inheritable(False)
    socket.send_fds(handoff, [b"L"], [listener.fileno()])
    listener.close()  # the forwarder holds it now; the client cannot accept on it
    return handoff


def receive_listener(handoff: socket.socket, timeout_s: float) -> socket.socket | None:
    """Outside: the listening socket the box passed out (None if the box ended or sent none in time). Reads
    its one byte only: what follows on the hand-off is the box asking for connections."""
    handoff.settimeout(timeout_s)
    try:
        _, fds, _, _ = socket.recv_fds(handoff, 1, 1)
    except (OSError, TimeoutError):
        return None
    handoff.settimeout(None)
    return socket.socket(fileno=fds[0]) if fds else None


def install_connector(handoff: socket.socket, port: int) -> None:
    """Inside the box: ``socket.create_connection`` to ``127.0.0.1:port`` (or ``localhost``) takes a
    connection the ``Broker`` made outside; any other address goes the ordinary way (and meets the empty
    namespace)."""
    plain = socket.create_connection
    default_timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT  # type: ignore[attr-defined]  # create_connection's sentinel
    lock = threading.Lock()

    def create_connection(address: tuple[str, int], timeout: Any = default_timeout,
                          source_address: Any = None, **kwargs: Any) -> socket.socket:
        if address[1] != port or address[0] not in ("127.0.0.1", "localhost"):
            return plain(address, timeout, source_address, **kwargs)
        with lock:  # one question on the hand-off at a time: its answer is the next byte
            handoff.sendall(_ASK)
            _, fds, _, _ = socket.recv_fds(handoff, 1, 1)
        if not fds:
            raise ConnectionRefusedError(f"the box's server on port {port} could not be reached")
        sock = socket.socket(fileno=fds[0])
        if timeout is not default_timeout:
            sock.settimeout(timeout)
        return sock

    socket.create_connection = create_connection  # type: ignore[assignment]


class Broker:
    """Outside: answer each byte the box sends on the hand-off with a connection to ``target``, passed in."""

    def __init__(self, handoff: socket.socket, target: tuple[str, int]) -> None:
        self._handoff, self._target = handoff, target
        self._thread = threading.Thread(target=self._serve, name="box-broker", daemon=True)

    def start(self) -> Broker:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                asked = self._handoff.recv(64)
            except OSError:
                return
            if not asked:
                return  # the box ended
            for _ in asked:
                try:
                    with socket.create_connection(self._target, timeout=30.0) as conn:
                        conn.settimeout(None)
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        socket.send_fds(self._handoff, [_GIVEN], [conn.fileno()])
                except OSError as exc:
                    log.warning("box: cannot reach the server at %s:%s: %s", *self._target, exc)
                    with contextlib.suppress(OSError):
                        self._handoff.sendall(_REFUSED)


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
