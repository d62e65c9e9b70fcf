"""``swarm run --box`` against a real server: a client written to escape is stopped at each door, and
its episodes, and a well-behaved client's, still finish.

One boxed run of the escaping client (``box_clients/escaping.py``: about 5 s) is shared by the six
attack tests; its run folder sits on a small tmpfs (``support.disks``, root) to show the box's writes
never reach the disk. Needs bubblewrap (``.ci/setup`` installs it): without it the tests fail, naming what
is missing, rather than pass unchecked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from support import ROOT, SWARM, ServeProcess
from support.disks import small_disk

from swarm.box import missing


@pytest.fixture(autouse=True, scope="module")
def _the_box_can_be_built() -> None:
    assert missing() is None, f"no OS sandbox here: {missing()} (.ci/setup installs bubblewrap)"


CLIENTS = Path(__file__).parent / "box_clients"
LETTERS = ROOT / "studies" / "examples" / "letters" / "client.py"


def boxed(client: Path, server: ServeProcess, run_dir: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("SWARM_TOKEN", "SWARM_CLIENT_TOKEN")}
    full_env.update(env or {})
    return subprocess.run([*SWARM, "run", str(client), "--box", "--state-dir", str(server.state_dir),
                           "--server", server.url, *args], cwd=run_dir, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


class Listener:
    """A loopback port that is not the server's; ``connected`` is set if anything reaches it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            self.sock.accept()
            self.connected.set()
        except OSError:
            pass


@pytest.fixture(scope="module")
def escape(server: ServeProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The escaping client's boxed run: its output, what it reported, and what the test saw outside."""
    base = tmp_path_factory.mktemp("box")
    study = base / "study"
    shutil.copytree(CLIENTS, study, ignore=shutil.ignore_patterns("__pycache__"))
    listener = Listener()
    outside = base / "outside"
    outside.mkdir()
    targets = {"marker": str(outside / "marker"), "token": str(server.state_dir / "token"),
               "outside": str(outside / "written"), "port": listener.port, "fill_mb": 64}
    (study / "targets.json").write_text(json.dumps(targets))
    with small_disk(base / "disk", 32) as disk:
        free_before = shutil.disk_usage(disk).free
        done = boxed(study / "escaping.py", server, disk, "--episodes", "8", "--box-disk-mb", "8")
        free_after = shutil.disk_usage(disk).free
    listener.sock.close()
    return {"done": done, "outside": outside, "listener": listener, "free": (free_before, free_after),
            "results": json.loads(next(line for line in done.stdout.splitlines()
                                       if line.startswith("ESCAPE "))[len("ESCAPE "):]),
            "violations": [line for line in done.stderr.splitlines() if line.startswith("sandbox violation: ")]}


def test_its_episodes_still_finish(escape: dict) -> None:
    done = escape["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished=8 aborted=0" in done.stdout


def test_os_system_through_computed_getattr_runs_nothing(escape: dict) -> None:
    assert escape["results"]["system"] != 0  # the shell could not be started (glibc answers 127)
    assert not (escape["outside"] / "marker").exists()
    assert any("ran a shell command" in v for v in escape["violations"]), escape["violations"]


def test_the_control_token_cannot_be_read(escape: dict, server: ServeProcess) -> None:
    assert escape["results"]["token"].startswith("FileNotFoundError")
    assert server.token not in escape["done"].stdout + escape["done"].stderr
    assert any("the server's state is not in the box" in v for v in escape["violations"])


def test_nothing_is_written_outside_the_run_folder(escape: dict) -> None:
    assert escape["results"]["write"] != "WROTE"
    assert list(escape["outside"].iterdir()) == []
    assert any("writes only its run folder" in v for v in escape["violations"])


def test_no_port_but_the_servers_is_reached(escape: dict) -> None:
    assert escape["results"]["connect"].startswith("ConnectionRefusedError")
    assert not escape["listener"].connected.is_set()
    assert any(f"connected to 127.0.0.1:{escape['listener'].port}" in v for v in escape["violations"])


def test_a_fork_bomb_makes_no_process(escape: dict) -> None:
    assert escape["results"]["forks"] == 0 and "PermissionError" in escape["results"]["fork"]
    assert any("forked a process" in v for v in escape["violations"])


def test_filling_the_disk_stops_at_the_box_quota(escape: dict) -> None:
    assert escape["results"]["fill_mb"] <= 8 and "No space left" in escape["results"]["fill"]
    before, after = escape["free"]
    assert after == before  # the real disk under the run folder got none of it
    assert any("filled its run folder" in v for v in escape["violations"])


def test_a_well_behaved_client_trains_boxed_and_keeps_its_rewards(server: ServeProcess, tmp_path: Path) -> None:
    done = boxed(LETTERS, server, tmp_path, "--episodes", "16", "--eval-every", "0",
                 "--rewards-out", str(tmp_path / "rewards.jsonl"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished=16 aborted=0" in done.stdout
    assert not [line for line in done.stderr.splitlines() if line.startswith("sandbox violation")], done.stderr
    assert len((tmp_path / "rewards.jsonl").read_text().splitlines()) == 16


def test_box_fails_clearly_without_bubblewrap(server: ServeProcess, tmp_path: Path) -> None:
    done = boxed(LETTERS, server, tmp_path, env={"PATH": str(tmp_path)})
    assert done.returncode == 2
    assert "--box needs an OS sandbox" in done.stderr and "bubblewrap is not installed" in done.stderr
