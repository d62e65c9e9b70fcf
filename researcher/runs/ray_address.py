"""Where the Ray Jobs API of the cluster ``--ray-address`` names is: the one place that address is read.

Accepted forms, each resolved by ``dashboard_url`` to the dashboard's http URL (the Jobs and state
APIs live there):
- ``HOST:PORT``: the GCS address ``ray start --head`` prints (``ray start --address='HOST:PORT'``);
  the dashboard's URL is read from that GCS, whose key-value store holds it;
- ``auto``: the cluster running on this machine, as Ray finds it (``RAY_ADDRESS`` included);
- ``ray://HOST:PORT``: a Ray Client server, which Ray connects to and asks;
- ``http(s)://HOST:PORT``: the dashboard itself.

Ray's own clients (``JobSubmissionClient``, ``ray.util.state``) replace the address they are given by
``RAY_API_SERVER_ADDRESS`` or ``RAY_ADDRESS`` from the environment. Ray's job docs have users export
``RAY_ADDRESS=http://127.0.0.1:8265``, and in a shell that did, ``--ray-address HOST:PORT`` went to
that port 8265 instead ("Failed to connect to Ray at address: http://HOST:8265"). Here an explicit
address wins: ``explicit()`` hides those two variables while Ray resolves it or builds a client.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["check", "dashboard_url", "explicit"]

_OVERRIDES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})")
_FORMS = ("HOST:PORT (the GCS address `ray start --head` prints), auto, ray://HOST:PORT or the dashboard's "
          "http(s)://HOST:PORT")
_RESOLVE = ("import sys\nfrom ray.dashboard.utils import get_address_for_submission_client as url\n"
            "print(url(sys.argv[1]))")
_RESOLVE_S = 90.0  # importing Ray (a few seconds) and Ray's own retries against a slow GCS
_REACH_S = 3.0  # a GCS port that does not accept a connection in this long is not there (Ray itself waits 40 s)


def check(address: str) -> str:
    """``address`` stripped, if it has one of the accepted forms; else ``ValueError`` naming them."""
    address = address.strip()
    if address == "auto" or address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host_port = address.removeprefix("ray://")
    if _HOST_PORT.fullmatch(host_port) and 0 < int(host_port.rsplit(":", 1)[1]) < 65536:
        return address
    raise ValueError(f"--ray-address {address!r} is not a Ray cluster address: give {_FORMS}")


def dashboard_url(address: str) -> str:
    """The http(s) URL of the Jobs API of the cluster at ``address``. ``ValueError`` for a malformed
    address, ``ConnectionError`` when no cluster answers there."""
    address = check(address)
    if address.startswith(("http://", "https://")):
        return address
    if address != "auto":
        _reachable(address.removeprefix("ray://"))
    # Ray resolves it in a child process: resolving a GCS address leaves a GCS client in the process that
    # asked (Ray's global key-value client), and once that GCS has gone, the process's next Ray call ends
    # it with status 1 and no message. A researcher outliving a restarted Ray head must not die of it (it
    # ended a whole test session 15 minutes after the cluster it had asked about was stopped).
    env = dict(os.environ)
    if address != "auto":
        for key in _OVERRIDES:
            env.pop(key, None)
    try:
        done = subprocess.run([sys.executable, "-c", _RESOLVE, address], env=env, capture_output=True, text=True,
                              timeout=_RESOLVE_S)
    except subprocess.TimeoutExpired as exc:
        raise ConnectionError(f"no Ray dashboard found through {address} within {_RESOLVE_S:g} s") from exc
    found = done.stdout.strip().splitlines()
    if done.returncode != 0 or not found:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ConnectionError(f"no Ray dashboard found through {address}: {why}")
    return found[-1].rstrip("/")


@contextmanager
def explicit(address: str) -> Iterator[None]:
    """While it lasts, Ray cannot swap ``address`` for ``RAY_API_SERVER_ADDRESS`` or ``RAY_ADDRESS``
    (except for ``auto``, which means "what Ray finds", the environment included)."""
    hidden = {} if address == "auto" else {k: os.environ.pop(k) for k in _OVERRIDES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


def _reachable(host_port: str) -> None:
    host, port = host_port.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_REACH_S).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host_port} ({exc}); start the cluster with `ray start --head` "
                              f"and pass the address it prints") from exc
