"""``swarm.ports``: a port chosen now for a process that binds it later is never one the kernel
hands out by itself (port 0, outgoing connections), so another process's server cannot land on it."""

from __future__ import annotations

import socket

from swarm import ports


def test_a_chosen_port_is_free_and_outside_the_kernel_s_range() -> None:
    low, high = ports.ephemeral_range()
    kernel_chosen = []
    for _ in range(20):  # servers other processes start on port 0 meanwhile
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        kernel_chosen.append(listener)
    try:
        taken = {sock.getsockname()[1] for sock in kernel_chosen}
        assert all(low <= port <= high for port in taken)
        chosen = [ports.free_port() for _ in range(50)]
        assert not taken & set(chosen)
        assert all(not low <= port <= high for port in chosen), (low, high, chosen)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", chosen[0]))  # free indeed
    finally:
        for sock in kernel_chosen:
            sock.close()


def test_a_port_in_use_is_not_chosen(monkeypatch) -> None:
    """Every draw lands on a port someone listens on: none of them is returned (the kernel picks)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (port + 1, 65535))
        monkeypatch.setattr(ports, "_LOWEST", port)  # the only port outside the range: the busy one
        assert ports.free_port() != port
