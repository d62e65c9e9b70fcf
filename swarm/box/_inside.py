"""The first Python code in the box: close the doors, then run ``swarm`` in this same interpreter.

``python -I -u -m swarm.box._inside CONFIG_JSON -- run CLIENT.py …`` (built by ``swarm.box._run``):

1. hand the server's port out (``swarm.box._forward.send_listener``), before anything else runs, and
   take connections to it from outside (``install_connector``);
2. add an audit hook that reports what the box is about to deny (``sandbox violation`` lines on the
   report pipe: a command, a fork, a connection elsewhere, a read of the server's state, a write
   outside the run folder). It only *reports*: the kernel does the denying, so code that slips past
   the hook (ctypes) is still stopped, only unseen;
3. install the seccomp filter (``swarm.box._seccomp``): no exec, no new process, from here on;
4. run ``swarm`` with the given arguments (``python -m swarm.cli``, in this process), never exec'ing anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_EXEC_EVENTS = {"os.system": "ran a shell command", "os.exec": "executed a program", "os.posix_spawn":
                "spawned a program", "os.spawn": "spawned a program", "subprocess.Popen": "started a subprocess",
                "os.fork": "forked a process", "os.forkpty": "forked a process", "pty.spawn": "spawned a program"}
_MAX_REPORTS = 50
_FORWARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_forward.py")


class _Reporter:
    """Writes each distinct violation once, as one JSON line, to the report pipe (at most ``_MAX_REPORTS``)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.seen, self.lock = fd, set[str](), threading.Lock()

    def __call__(self, what: str) -> None:
        with self.lock:
            if what in self.seen or len(self.seen) >= _MAX_REPORTS:
                return
            self.seen.add(what)
            with contextlib.suppress(OSError):
                os.write(self.fd, (json.dumps({"violation": what[:300]}) + "\n").encode())


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _connector(frame: FrameType) -> bool:
    """The box's own ``socket.create_connection`` (``_forward.install_connector``): it passes a study's
    connect on, so the caller to judge is the one before it."""
    code = frame.f_code
    return code.co_name == "create_connection" and code.co_filename == _FORWARD


def audit_hook(config: dict[str, Any], report: _Reporter) -> Any:
    """The hook for ``sys.addaudithook``: names the attempts the box denies (see the module docstring)."""
    port, hidden = config.get("port"), config["hidden"]
    writable = [config["run_dir"], "/dev/null", *config["outputs"]]
    stdlib = [os.path.dirname(os.__file__)]
    libraries = [sys.prefix, os.path.dirname(os.path.dirname(__file__))]  # the environment, swarm

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in _EXEC_EVENTS and event not in ("socket.connect", "open"):
            return
        # Only the study's own attempts are reported: the first caller outside the standard library
        # must be the study's code, not the environment's or swarm's (a library's denied probe, such
        # as openai's ``platform.processor()`` running ``uname``, is denied all the same).
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and (_under(frame.f_code.co_filename, stdlib) or _connector(frame)):
            frame = frame.f_back
        if frame is None or frame.f_code.co_filename.startswith("<frozen") or \
                _under(frame.f_code.co_filename, libraries):
            return
        if event in _EXEC_EVENTS:
            what = args[0] if args and not isinstance(args[0], int) else ""
            report(f"{_EXEC_EVENTS[event]} ({what!s:.120}): denied, the box executes nothing")
        elif event == "socket.connect":
            sock, address = args
            family = getattr(sock, "family", None)
            if family == socket.AF_UNIX:
                report(f"connected to the Unix socket {address!r}: denied, the box has no sockets but its server's")
            elif family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and \
                    (address[0] not in ("127.0.0.1", "localhost") or address[1] != port):
                report(f"connected to {address[0]}:{address[1]}: denied, the box reaches only its server")
        elif event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(args[0]))
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            if _under(path, hidden):
                report(f"read {path}: denied, the server's state is not in the box")
            elif (flags & _WRITE_FLAGS or any(c in mode for c in "wax+")) and not _under(path, writable):
                report(f"wrote {path}: denied, the box writes only its run folder")

    return hook


def _watch_disk(run_dir: str, disk_mb: int, report: _Reporter) -> None:
    """Report once when the run folder's tmpfs is (nearly) full: the client's next writes fail."""
    while True:
        try:
            stat = os.statvfs(run_dir)
        except OSError:
            return
        if stat.f_bavail * stat.f_frsize < min(1 << 20, (disk_mb << 20) // 16):
            report(f"filled its run folder ({disk_mb} MiB): further writes fail with ENOSPC")
            return
        time.sleep(0.5)


def main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    command = argv[argv.index("--") + 1:]
    if config.get("port"):
        from swarm.box._forward import install_connector, send_listener

        install_connector(send_listener(config["handoff"], config["port"]), config["port"])
    report = _Reporter(config["report"])
    os.set_inheritable(config["report"], False)
    sys.addaudithook(audit_hook(config, report))
    from swarm.box import _seccomp

    _seccomp.install()
    threading.Thread(target=_watch_disk, args=(config["run_dir"], config["disk_mb"], report), name="box-disk",
                     daemon=True).start()
    Path(config["run_dir"]).mkdir(parents=True, exist_ok=True)
    sys.argv = ["swarm", *command]
    runpy.run_module("swarm.cli", run_name="__main__", alter_sys=True)  # by name: swarm.cli imports this package


if __name__ == "__main__":
    main(sys.argv[1:])
