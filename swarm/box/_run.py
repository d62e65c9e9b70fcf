"""Run a ``swarm`` command in the box and wait for it: bubblewrap, the port hand-off, the reports.

``run_boxed_swarm`` is what ``swarm run --box`` calls. This process stays outside the box: it starts
bubblewrap, answers the box's requests for connections to the server and forwards the port it
hands out (``swarm.box._forward``), prints each violation the box reports (``sandbox violation: …`` on stderr,
the line the researcher records as a ``sandbox_violation`` event), and passes a SIGTERM or Ctrl-C
on to the boxed ``swarm`` so it finishes or aborts its episodes as it would unboxed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swarm.box._forward import Broker, Forwarder, receive_listener
from swarm.box._plan import BoxPlan
from swarm.box._probe import BoxUnavailable, missing

__all__ = ["VIOLATION_PREFIX", "run_boxed_swarm"]

VIOLATION_PREFIX = "sandbox violation: "
_HANDOFF_TIMEOUT_S = 60.0  # the box's interpreter starts and opens its listener (seconds on a busy machine)
_STOP_GRACE_S = 30.0


def run_boxed_swarm(args: Sequence[str], plan: BoxPlan, *, env: Mapping[str, str],
                    server: tuple[str, int] | None, report: Callable[[str], None]) -> int:
    """Run ``swarm ARGS`` in the box ``plan`` describes, reaching only ``server`` (host, port); its
    exit code (128 + signal when the boxed process was killed). Raises ``BoxUnavailable`` naming what
    this machine lacks."""
    why = missing()
    if why:
        raise BoxUnavailable(why)
    handoff_out, handoff_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    report_r, report_w = os.pipe()
    info_r, info_w = os.pipe()
    config = {"handoff": handoff_in.fileno(), "report": report_w, "port": server[1] if server else None,
              "run_dir": str(plan.run_dir), "disk_mb": plan.disk_mb, "hidden": [str(p) for p in plan.hidden],
              "outputs": [str(p) for p in plan.outputs]}
    for output in plan.outputs:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.touch()
    inner = [sys.executable, "-I", "-u", "-m", "swarm.box._inside", json.dumps(config), "--", *args]
    plan = dataclasses.replace(plan, extra_args=["--info-fd", str(info_w)])
    proc = subprocess.Popen(plan.bwrap_argv(missing.bwrap or "bwrap", inner), env=dict(env),
                            pass_fds=(handoff_in.fileno(), report_w, info_w), stdin=subprocess.DEVNULL)
    handoff_in.close()
    os.close(report_w)
    os.close(info_w)
    readers = [threading.Thread(target=_read_reports, args=(report_r, report), daemon=True)]
    readers[0].start()
    forwarder = None
    try:
        if server is not None:
            listener = receive_listener(handoff_out, _HANDOFF_TIMEOUT_S)
            if listener is not None:
                forwarder = Forwarder(listener, server).start()
                Broker(handoff_out, server).start()
        child = _child_pid(info_r)
        return _wait(proc, child)
    finally:
        handoff_out.close()
        if forwarder is not None:
            forwarder.close()
        readers[0].join(timeout=2.0)


def _wait(proc: subprocess.Popen[bytes], child: int | None) -> int:
    """Wait for bubblewrap; on Ctrl-C or SIGTERM (``swarm.stopping`` turns it into KeyboardInterrupt) stop the
    boxed ``swarm`` the way ``swarm run`` stops (SIGTERM), then kill the box if it does not end."""
    try:
        return proc.wait()
    except KeyboardInterrupt:
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(child, signal.SIGTERM)  # type: ignore[arg-type]  # None: no pid known, the box is killed below
        try:
            return proc.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def _child_pid(info_r: int) -> int | None:
    """The boxed process's pid (outside the box's PID namespace), from bubblewrap's ``--info-fd`` JSON."""
    with os.fdopen(info_r, "rb") as info:
        raw = info.read()
    try:
        return int(json.loads(raw)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _read_reports(fd: int, report: Callable[[str], None]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            try:
                what = str(json.loads(line)["violation"])
            except (ValueError, KeyError, TypeError):
                what = line.decode(errors="replace").strip()[:300]  # the client wrote to the pipe itself
            report(what)


def server_address(url: str) -> tuple[str, int, str]:
    """``url``'s (host, port) and the URL the boxed client uses: the same port on the box's loopback."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise BoxUnavailable(f"--box reaches its server over plain http (a URL like http://HOST:PORT), not {url!r}")
    port = parts.port or 80
    return parts.hostname, port, parts._replace(netloc=f"127.0.0.1:{port}").geturl()


def writable_run_dir(path: Path) -> Path:
    """The run folder, absolute (created): the box's only writable place."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
