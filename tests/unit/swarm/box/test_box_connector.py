"""The box's fast path to its server (``swarm.box._forward``): a connection asked for inside is made
outside, by the broker, to the one address it was given, and handed in; the client's bytes then reach
the server directly. Any other address goes the ordinary way."""

from __future__ import annotations

import socket
import threading

import pytest

from swarm.box._forward import Broker, install_connector


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(b"echo:" + data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_connection_to_the_servers_address_is_made_outside_and_handed_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "create_connection", socket.create_connection)  # restored after the test
    server, target = _echo_server()
    inside, outside = socket.socketpair()
    box_port = _unused_port()  # what the box calls its server: nothing listens there
    Broker(outside, ("127.0.0.1", target)).start()
    install_connector(inside, box_port)
    try:
        for _ in range(3):  # each ask is one connection, answered in turn
            with socket.create_connection(("127.0.0.1", box_port), timeout=5) as conn:
                assert conn.getpeername()[1] == target and conn.gettimeout() == 5
                conn.sendall(b"hi")
                assert conn.recv(64) == b"echo:hi"
        with pytest.raises(ConnectionRefusedError):  # any other port goes the ordinary way
            socket.create_connection(("127.0.0.1", _unused_port()), timeout=5)
    finally:
        server.close()
        inside.close()


def test_a_server_the_broker_cannot_reach_is_refused_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "create_connection", socket.create_connection)
    inside, outside = socket.socketpair()
    Broker(outside, ("127.0.0.1", _unused_port())).start()
    install_connector(inside, 4321)
    with pytest.raises(ConnectionRefusedError, match="port 4321 could not be reached"):
        socket.create_connection(("localhost", 4321))
    inside.close()
