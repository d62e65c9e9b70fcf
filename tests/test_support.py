"""The shared test helpers (tests/support): what a failed wait says, and a free port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import free_port, wait_for


def test_wait_for_returns_the_first_truthy_value() -> None:
    calls = iter([0, [], "ready"])
    assert wait_for(lambda: next(calls), 5, interval=0.001) == "ready"


def test_a_timed_out_wait_names_what_it_waited_for() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"waited 0\.05 s for the moon, in vain"):
        wait_for(lambda: False, 0.05, what="the moon", interval=0.01)
    with pytest.raises(pytest.fail.Exception, match=r"lambda: 1 > 2.*test_support\.py:\d+"):
        wait_for(lambda: 1 > 2, 0.05, interval=0.01)  # no `what`: the condition's own source line


def test_a_wait_on_a_process_ends_when_it_exits_and_shows_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("boom: no model\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"(?s)the process exited with 3.*boom: no model"):
        wait_for(lambda: False, 60, what="readiness", proc=proc, log=log)
    assert time.monotonic() - started < 30  # not the full timeout


def test_free_port_is_bindable_on_loopback() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
