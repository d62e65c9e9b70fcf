"""No vLLM outlives its server. The child's shim asks Linux for a SIGTERM when the server dies, but vLLM
ignores it at times (while it starts: the vLLM soak found orphans of 2 GB each, until memory ran out), so
the shim's watchdog SIGKILLs vLLM's process group once vLLM has lost its server. Real processes: a
stand-in server runs the shim with a child that ignores SIGTERM, and is SIGKILLed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support import wait_for

from swarm.backends.vllm.process import _PARENT_DEATH_SHIM, _group_alive

_SERVER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), "-c", sys.argv[2]],
                         start_new_session=True)
print(child.pid, flush=True)
child.wait()  # a server reaps its vLLM
time.sleep(600)
"""
_STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
_BRIEF = "import time; time.sleep(2)"


def _start(child: str) -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen([sys.executable, "-c", _SERVER, _PARENT_DEATH_SHIM, child], stdout=subprocess.PIPE,
                              text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def test_a_vllm_that_ignores_sigterm_dies_with_its_sigkilled_server() -> None:
    server, vllm = _start(_STUBBORN)
    try:
        time.sleep(1.0)
        assert _group_alive(vllm)
        server.kill()  # no cleanup runs: the shim's SIGTERM comes, and is ignored
        server.wait()
        time.sleep(3.0)
        assert _group_alive(vllm)  # the SIGTERM's grace
        wait_for(lambda: not _group_alive(vllm), 30, what="the watchdog to SIGKILL vLLM's group", interval=0.2)
    finally:
        server.kill()
        server.wait()
        if _group_alive(vllm):
            os.killpg(vllm, 9)


def test_the_watchdog_ends_with_a_vllm_that_ends_by_itself() -> None:
    server, vllm = _start(_BRIEF)
    try:
        wait_for(lambda: not _group_alive(vllm), 15, what="vLLM and its watchdog to end", interval=0.2)
        assert server.poll() is None  # the server lives on, and nothing of vLLM's is left
    finally:
        server.kill()
        server.wait()
