"""A real two-node Ray cluster on this machine, for the Ray placement tests.

``ray start --head`` (custom resource ``node_a``) plus a second ``ray start --address …`` (``node_b``),
each with its own temp dir and every port chosen free on 127.0.0.1, one CPU each, so two runs asking
one CPU land one on each node. Both are started ``--block`` in their own sessions; teardown kills
those sessions, then any process whose command line names the cluster's temp dir (raylets, workers,
job drivers), and checks none is left. It never runs ``ray stop``: that would stop every Ray
process of this user on the machine, other people's clusters included.

Where Ray binds beyond 127.0.0.1 (``ss -ltnp`` while the cluster ran, Ray 2.60): the dashboard's
HTTP port binds 127.0.0.1 (``--dashboard-host``) and the runs' swarm servers bind 127.0.0.1
(``RESEARCHER_BIND_HOST``); the GCS and each raylet's node-manager and object-manager gRPC ports
listen on all interfaces (``*``) and the dashboard/autoscaler metrics ports on 0.0.0.0, whatever
``--node-ip-address`` says — Ray offers no flag to bind those to loopback. Every port is chosen free
per test, so nothing collides with other clusters on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support import free_port, wait_for

REPO = Path(__file__).resolve().parents[3]
RAY = str(REPO / ".venv" / "bin" / "ray") if (REPO / ".venv" / "bin" / "ray").exists() else shutil.which("ray") or "ray"


def _node_ports() -> list[str]:
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
            "--min-worker-port", "0", "--max-worker-port", "0"]


@dataclass
class Cluster:
    root: Path
    gcs: str
    dashboard: str
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    also: list[Path] = field(default_factory=list)  # folders whose processes die with the cluster (jobs' run dirs)

    def start_node(self, name: str, resources: dict[str, float], head: bool = False, cpus: int = 1) -> None:
        argv = [RAY, "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus),
                "--resources", json.dumps(resources), "--temp-dir", str(self.root / name), "--disable-usage-stats",
                *_node_ports()]
        if head:
            argv += ["--head", "--port", self.gcs.rsplit(":", 1)[1], "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", self.dashboard.rsplit(":", 1)[1], "--include-dashboard", "true",
                     "--ray-client-server-port", str(free_port())]
        else:
            argv += ["--address", self.gcs]
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the process writes it for its life
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        log.close()

    def wait_nodes(self, count: int, timeout: float = 90) -> None:
        from ray.util.state import list_nodes

        def alive() -> bool:
            try:
                return len(list_nodes(address=self.dashboard, filters=[("state", "=", "ALIVE")])) >= count
            except Exception:  # the dashboard is still starting
                return False

        wait_for(alive, timeout, what=lambda: f"{count} live Ray nodes\n{self.logs()}", interval=1)

    def node_names(self) -> dict[str, str]:
        """Ray node id -> our name (node_a / node_b), by each node's custom resource."""
        from ray.util.state import list_nodes

        names = {}
        for node in list_nodes(address=self.dashboard, detail=True):
            for name in ("node_a", "node_b"):
                if name in (node.resources_total or {}):
                    names[node.node_id] = name
        return names

    def raylet_pids(self, name: str) -> list[int]:
        return [pid for pid, cmd in _processes() if "raylet/raylet" in cmd and str(self.root / name) in cmd]

    def kill_node(self, name: str) -> None:
        """The node dies: its `ray start` session and its raylet, SIGKILLed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        for pid in self.raylet_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.procs[name].wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.root.glob("*.log"))

    def left(self) -> list[tuple[int, str]]:
        """Processes of this cluster: Ray's (they name its temp dir) and its jobs' (they name a run dir
        under ``also``); a job's process may outlive a SIGKILLed raylet."""
        marks = [str(self.root), *(str(p) for p in self.also)]
        return [(pid, cmd) for pid, cmd in _processes() if any(m in cmd for m in marks) and pid != os.getpid()]

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
            time.sleep(0.3)
        for _ in range(3):
            for proc in self.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.poll()
            for pid, _cmd in self.left():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(1)
        for proc in self.procs.values():
            proc.wait()


def _processes() -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd:
            found.append((int(entry.name), cmd))
    return found


@contextlib.contextmanager
def two_node_cluster(env: dict[str, str], also: list[Path] | None = None) -> Iterator[Cluster]:
    """Head (node_a) + a second node (node_b), one CPU each; torn down and checked empty at the end."""
    root = Path(tempfile.mkdtemp(prefix="rw", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    # RESEARCHER_BIND_HOST: the runs' servers listen on loopback (inside a job Ray reports this machine's
    # eth0 address as the node's IP, whatever --node-ip-address says).
    env = {**env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RESEARCHER_BIND_HOST": "127.0.0.1"}
    cluster = Cluster(root, f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", env, also=also or [])
    try:
        cluster.start_node("a", {"node_a": 1}, head=True)
        cluster.wait_nodes(1)
        cluster.start_node("b", {"node_b": 1})
        cluster.wait_nodes(2)
        yield cluster
    finally:
        cluster.stop()
        left = cluster.left()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes left: {left}"
