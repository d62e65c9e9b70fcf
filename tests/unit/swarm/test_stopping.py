"""``swarm.stopping`` with real processes: SIGTERM takes Ctrl-C's path, a stop has a deadline, and a
process's children (and theirs) end with it. The commands built on it are tested where their other
CLI tests live (``tests/integration/swarm_client/test_cli_stops.py``, ``tests/e2e/researcher/test_clean_stops.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import ROOT, wait_for
from support.stops import family, terminate

# A child that starts a grandchild and ignores SIGTERM, so only its group's SIGKILL ends them both.
_STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print('up', flush=True); "
             "time.sleep(120)")


def _script(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    path = tmp_path / "proc.py"
    path.write_text("import sys, time\nfrom swarm import stopping\n" + body)
    return subprocess.Popen([sys.executable, str(path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def _ready(proc: subprocess.Popen[str], count: int) -> None:
    """Until ``proc``'s family has ``count`` processes (its children started)."""
    wait_for(lambda: len(family(proc.pid)) >= count, 30, what=f"{count} processes under {proc.pid}", proc=proc)


def test_sigterm_ends_a_foreground_child_and_its_group(tmp_path: Path) -> None:
    proc = _script(tmp_path, f"code = stopping.run_child([sys.executable, '-c', {_STUBBORN!r}])\n"
                             "print('child ended', code, flush=True)\n")
    _ready(proc, 2)
    took, code, kin = terminate(proc)
    assert code == 0 and len(kin) == 2, (code, kin)
    assert "child ended 0" in proc.stdout.read()
    assert took < 3.0 + 2.0, took  # the child's group: SIGTERM ignored, SIGKILL after the 3 s grace


def test_a_stop_that_hangs_is_cut_at_the_deadline_with_its_children(tmp_path: Path) -> None:
    """The Ctrl-C path runs, but hangs (a peer that never answers): the deadline exits with 128 + 15
    and kills the children started through ``start_child``."""
    proc = _script(tmp_path, "stopping.interrupt_on_sigterm(deadline_s=1.5)\n"
                             f"stopping.start_child([sys.executable, '-c', {_STUBBORN!r}])\n"
                             "try:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
                             "    print('cleaning up', flush=True)\n    time.sleep(120)\n")
    _ready(proc, 2)
    took, code, _ = terminate(proc, within_s=5.0)
    output = proc.stdout.read()
    assert code == 128 + 15 and 1.4 < took < 4.0, (code, took, output)
    assert "cleaning up" in output and "still stopping after 1.5 s: exiting now" in output, output


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    # 'up' is printed inside the try: a SIGTERM right after it still lands where it is handled.
    proc = _script(tmp_path, "stopping.interrupt_on_sigterm(deadline_s=60)\n"
                             "try:\n    print('up', flush=True)\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
                             "    print('cleaning up', flush=True)\n    time.sleep(120)\n")
    assert proc.stdout.readline().strip() == "up"
    proc.terminate()
    assert proc.stdout.readline().strip() == "cleaning up"
    took, code, _ = terminate(proc, within_s=3.0)
    assert code == 128 + 15 and took < 2.0, (code, took)


# A worker thread takes the SIGTERM itself (the kernel may hand a process's signal to any thread): Python
# then only marks the handler due, and a main thread blocked in an untimed wait would not run it.
_CAUGHT_BY_A_WORKER = ("import signal, threading\nfrom concurrent.futures import ThreadPoolExecutor\n"
                       "stopping.interrupt_on_sigterm(deadline_s=1.5)\nforever = threading.Event()\n"
                       "def worker():\n    time.sleep(0.5)  # the main thread is waiting by then\n"
                       "    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)\n    forever.wait()\n"
                       "futures = [ThreadPoolExecutor(1).submit(worker)]\n")


def test_a_signal_another_thread_caught_still_stops_the_process(tmp_path: Path) -> None:
    """Before, the main thread in ``Future.result()`` never saw it and the run never stopped (CI's
    ``swarm run``). A timed wait (``wait_interruptibly``) takes the clean Ctrl-C path; an untimed one
    is cut at the deadline, which the wakeup-fd watcher armed."""
    timed = _script(tmp_path, _CAUGHT_BY_A_WORKER + "try:\n    stopping.wait_interruptibly(futures)\n"
                                                    "except KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
                                                    "    stopping.exit_now(15, 'cleaned up')\n")
    assert timed.wait(timeout=30) == 128 + 15
    assert "interrupted" in timed.stdout.read()
    untimed = _script(tmp_path, _CAUGHT_BY_A_WORKER + "futures[0].result()\n")
    assert untimed.wait(timeout=30) == 128 + 15
    assert "still stopping after 1.5 s: exiting now" in untimed.stdout.read()


def test_a_handler_of_its_own_still_gets_the_first_signal_after_the_watcher_saw_it(tmp_path: Path) -> None:
    """``swarm serve`` arms the watcher while its model loads, then uvicorn's handler takes the signals
    and calls ``on_stop_signal``. The watcher arms the deadline for the same signal first (here: the
    handler waits to be sure); that is no second signal, so the graceful shutdown (a checkpoint) runs."""
    proc = _script(tmp_path, "import signal\nstopping.interrupt_on_sigterm(deadline_s=60)\nstopping_now = []\n"
                             "def handle_exit(signum, frame):\n    time.sleep(0.5)\n"
                             "    stopping.on_stop_signal(signum)\n    stopping_now.append(signum)\n"
                             "signal.signal(signal.SIGTERM, handle_exit)\nprint('up', flush=True)\n"
                             "while not stopping_now:\n    time.sleep(0.05)\nprint('shut down gracefully', flush=True)\n")
    assert proc.stdout.readline().strip() == "up"
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert "shut down gracefully" in proc.stdout.read()


def test_a_signal_while_the_child_starts_still_ends_it(tmp_path: Path) -> None:
    """SIGTERM while ``Popen`` waits for the forked child's exec (here a slow ``preexec_fn``): the child
    is still ended, not orphaned (CI saw ``researcher ui``'s MLflow server outlive it this way)."""
    proc = _script(tmp_path, "code = stopping.run_child([sys.executable, '-c', 'import time; time.sleep(120)'], "
                             "preexec_fn=lambda: time.sleep(2))\nprint('child ended', code, flush=True)\n")
    _ready(proc, 1)  # forked, not yet exec'd
    _, code, kin = terminate(proc)
    assert code == 0 and len(kin) == 1, (code, kin)
    assert "child ended 0" in proc.stdout.read()
