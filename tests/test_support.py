"""The shared test helpers (tests/support): what a failed wait says, a free port, the process harness, and
how a parallel run groups the tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import ManagedProcess, ServeProcess, free_port, parallel, wait_for


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


def test_a_managed_process_logs_stops_and_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARM_TOKEN", "from-the-shell")  # never handed on: a process gets its credentials by argument
    code = ("import os, signal, sys, time; print('token', os.environ.get('SWARM_TOKEN'), os.environ['EXTRA'], "
            "flush=True); signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); time.sleep(60)")
    proc = ManagedProcess(tmp_path / "p.log").launch([sys.executable, "-c", code], env={"EXTRA": "given"})
    wait_for(lambda: "token" in proc.log(), 30, proc=proc.process, log=proc.log_path)
    assert proc.alive() and proc.log().strip() == "token None given"
    proc.stop()  # SIGTERM: a clean end
    assert not proc.alive() and proc.process is not None and proc.process.returncode == 7
    stubborn = ManagedProcess(tmp_path / "s.log").launch(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', "
         "flush=True); time.sleep(60)"])
    wait_for(lambda: "up" in stubborn.log(), 30, proc=stubborn.process)
    stubborn.stop(grace_s=0.5)  # ignores SIGTERM: SIGKILLed after the grace period
    assert stubborn.process is not None and stubborn.process.returncode == -9
    stubborn.kill()  # a no-op once it is gone


def test_a_refused_start_returns_its_exit_code_and_a_hung_one_fails(tmp_path: Path) -> None:
    quits = ManagedProcess(tmp_path / "q.log").launch([sys.executable, "-c", "print('no'); raise SystemExit(2)"])
    assert quits.wait_exit(30) == 2 and quits.log() == "no\n"
    hangs = ManagedProcess(tmp_path / "h.log").launch([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(pytest.fail.Exception, match=r"waited 0\.2 s for it to give up, in vain"):
        hangs.wait_exit(0.2, what="it to give up")
    assert not hangs.alive()  # killed, not left behind


def test_a_serve_process_passes_its_settings_as_arguments(tmp_path: Path) -> None:
    server = ServeProcess(port=1234, state_dir=tmp_path / "s", config=tmp_path / "c.toml", given_token="t",
                          extra_args=("--threads", "1"))
    assert server.args()[3:] == ["serve", "--port", "1234", "--state-dir", str(tmp_path / "s"), "--model", "tiny",
                                 "--token", "t", "--config", str(tmp_path / "c.toml"), "--threads", "1"]
    assert server.log_path == tmp_path / "s" / "serve.log" and server.url == "http://127.0.0.1:1234"


def test_a_dead_ray_worker_is_reported_with_its_stderr_and_raylet_lines(tmp_path: Path) -> None:
    from support.ray_logs import dead_worker_pids, worker_post_mortem

    text = ("E   ray.exceptions.ActorDiedError: The actor died unexpectedly\n\tclass_name: W\n\tpid: 21096\n"
            "... ActorDiedError again\n\tpid: 21096\n")
    assert dead_worker_pids(text) == [21096]
    assert dead_worker_pids("AssertionError: pid: 5") == []
    logs = tmp_path / "session_2026-11-26_00-00-00_000000_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-abc-01000000-21096.err").write_text("start\nterminate called after gloo::IoException\n")
    (logs / "raylet.out").write_text("worker pid=21096 exited, signal 6\nworker pid=7 ok\n")
    report = worker_post_mortem(21096, root=tmp_path)
    assert "gloo::IoException" in report and "signal 6" in report and "pid=7" not in report
    assert worker_post_mortem(999, root=tmp_path) == ""


def test_the_parallel_groups_name_modules_that_exist_and_put_the_long_ones_first() -> None:
    root = Path(__file__).resolve().parents[1]
    assert all((root / module).is_file() for module in parallel.RAY_MODULES), "a renamed Ray module left its group"
    ids = ["tests/unit/swarm/test_plan.py::t", "tests/e2e/researcher/test_stop.py::t",
           "tests/e2e/engines/test_verl_server.py::t"]
    assert [parallel.group(i) for i in ids] == ["tests/unit/swarm/test_plan.py", "tests/e2e/researcher/test_stop.py", "ray"]
    assert sorted(ids, key=parallel.rank) == [ids[2], ids[1], ids[0]]
