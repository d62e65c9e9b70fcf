"""Runs placed by resources: GPU discovery, local GPU assignment and the run queue.

GPUs are faked the two ways ``researcher.runs.resources`` reads them: a ``CUDA_VISIBLE_DEVICES`` list, or
an ``nvidia-smi`` script first on PATH that prints one index a line. The tiny CPU model ignores
CUDA_VISIBLE_DEVICES, so a study on "4 GPUs" runs for real on this CPU machine, and each server's
environment (``/proc/<pid>/environ``) shows which devices it was given.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import free_port

from researcher.runs import record as runs
from researcher.runs import resources
from researcher.runs.launcher import Launcher
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus

TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


def fake_nvidia_smi(folder: Path, count: int) -> Path:
    """A folder holding an ``nvidia-smi`` that reports ``count`` GPUs (put it first on PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {i}\n" for i in range(count)))
    script.chmod(0o755)
    return folder


def test_gpus_are_discovered_from_cuda_visible_devices_or_nvidia_smi(tmp_path: Path) -> None:
    fake = fake_nvidia_smi(tmp_path / "bin", 4)
    path = f"{fake}:{os.environ['PATH']}"
    assert resources.discover_gpus({"PATH": path}) == ["0", "1", "2", "3"]
    assert resources.discover_gpus({"PATH": path, "CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
    assert resources.discover_gpus({"PATH": path, "CUDA_VISIBLE_DEVICES": ""}) == []
    assert resources.discover_gpus({"PATH": str(tmp_path / "nothing")}) == []


def test_requests_and_assignment() -> None:
    assert resources.request_for({}, {}, machine_gpus=0).amounts == {"CPU": 1.0}
    assert resources.request_for({}, {}, machine_gpus=4).amounts == {"CPU": 1.0, "GPU": 1.0}
    assert resources.request_for({"gpus_per_run": 0.5, "run_resources": {"node_b": 1}}, {}, 4).amounts == \
        {"CPU": 1.0, "GPU": 0.5, "node_b": 1.0}
    assert resources.parse_run_resources('{"GPU": 2}') == {"GPU": 2.0}
    with pytest.raises(ValueError, match="JSON object"):
        resources.parse_run_resources("GPU=1")
    with pytest.raises(ValueError, match="whole GPUs"):
        resources.request_for({"gpus_per_run": 1.5}, {}, 4)

    one, half, two = (resources.Request(amounts={"GPU": g}) for g in (1, 0.5, 2))
    devices = ["0", "1", "2", "3"]
    assert resources.assign(one, devices, {}) == ["0"]
    assert resources.assign(one, devices, {"0": 1, "1": 0.5}) == ["2"]
    assert resources.assign(two, devices, {"0": 1, "1": 1, "2": 1}) is None  # one free: it waits
    assert resources.assign(half, devices, {"0": 1, "1": 0.5}) == ["1"]  # shares the half-used device
    assert resources.assign(half, ["0"], {"0": 1}) is None  # never beside a whole-device run
    assert resources.never_fits(two, ["0"]) and resources.never_fits(one, devices) is None


def _record(key: str, gpus: float) -> RunRecord:
    return RunRecord(key=key, study_id="s", iteration=1, trial=int(key.rsplit("/", 1)[1]), experiment="e", seed=0,
                     config={}, client="client.py", target_step=1, episodes=1, group_size=2,
                     resources={"CPU": 1, "GPU": gpus})


def test_reserve_gives_each_run_its_own_devices_and_queues_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    launcher = Launcher(["swarm"], gpus=["0", "1"], artifacts_root=root)
    dirs = [root / "s" / "runs" / f"1-{i}" for i in range(3)]
    records = [_record(f"s/1/{i}", 1) for i in range(3)]
    for run_dir, record in zip(dirs, records):
        runs.save(run_dir, record)
    assert launcher.reserve(dirs[0], records[0]) and launcher.reserve(dirs[1], records[1])
    assert not launcher.reserve(dirs[2], records[2])  # both devices held: it waits
    assert {tuple(runs.load(d).devices) for d in dirs[:2]} == {("0",), ("1",)}
    assert runs.load(dirs[2]).queued_at is not None
    # Another study on this machine sees the same devices held (records are read from disk).
    other = Launcher(["swarm"], gpus=["0", "1"], artifacts_root=root)
    stranger = _record("t/1/0", 1)
    runs.save(root / "t" / "runs" / "1-0", stranger)
    assert not other.reserve(root / "t" / "runs" / "1-0", stranger)
    # A run ends: its device goes to the one that waited, which records how long it waited.
    records[0].status = RunStatus.FINISHED  # as if it had run (a pending record cannot move there)
    runs.save(dirs[0], records[0])
    time.sleep(0.05)
    assert launcher.reserve(dirs[2], records[2])
    again = runs.load(dirs[2])
    assert again.devices == records[0].devices and again.queued_at is None and again.queued_s > 0
    assert launcher._placed_env(again)["CUDA_VISIBLE_DEVICES"] == again.devices[0]


def _devices_of(pid: int | None) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [e for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
    return found[0].split(b"=", 1)[1].decode() if found else None


@pytest.mark.slow
@pytest.mark.study  # about 3 minutes of CI worker time; the placement rules keep their unit tests above
def test_four_fake_gpus_one_run_each_queue_and_survive_a_restart(cli, tmp_path: Path,
                                                                  no_leftover_servers: Callable[[Path], None]) -> None:
    """Six runs asking one GPU each on a machine reporting four: at most four live at once, on distinct
    devices (their servers' environments say so), two queue; a SIGKILLed researcher's resume keeps
    every assignment and launches nothing twice."""
    cli.env["PATH"] = f"{fake_nvidia_smi(tmp_path / 'bin', 4)}:{cli.env['PATH']}"
    cli.env.pop("CUDA_VISIBLE_DEVICES", None)
    sid = "gpus"
    runs_dir = cli.artifacts / sid / "runs"
    proc = cli.popen("start", "--topic", TOPIC, "--budget", "8m", "--study-id", sid, "--steps-per-run", "3",
                     "--seeds", "3", "--parallel", "6", "--max-iterations", "1", *cli.dirs, log=tmp_path / "start.log")
    seen: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 240
        while True:
            records = runs.all_records(runs_dir)
            live = [r for r in records if r.status == "running" and r.devices]
            for r in live:
                env_devices = _devices_of(r.server_pid)
                if env_devices is not None:
                    assert env_devices == ",".join(r.devices), (r.key, env_devices, r.devices)
                    seen[r.key] = env_devices
            held = [d for r in live for d in r.devices]
            assert len(held) == len(set(held)) <= 4, [(r.key, r.devices) for r in live]
            if len(records) == 6 and len(live) == 4 and any(r.queued_at for r in records) \
                    and any(r.last_step >= 1 for r in live):
                break
            assert proc.poll() is None, (tmp_path / "start.log").read_text()[-3000:]
            assert time.monotonic() < deadline, [(r.key, r.status, r.devices, r.queued_at) for r in records]
            time.sleep(0.3)
        status = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
        queued = [p for p in status["placements"] if p["status"] == "queued"]
        assert len(queued) == 2 and all(p["queued_s"] >= 0 and not p["devices"] for p in queued)
        assert all(p["placement"] == "local" and p["node"] and p["resources"] == {"CPU": 1.0, "GPU": 1.0}
                   for p in status["placements"] if p["status"] == "running")
        before = {r.key: (r.devices, r.launches) for r in records if r.launches}
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    resumed = cli.run("resume", sid, *cli.dirs, timeout=420)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    records = runs.all_records(runs_dir)
    assert len(records) == 6 and {r.status for r in records} == {"finished"}
    assert all(r.launches == 1 for r in records)
    for key, (devices, _) in before.items():  # a run re-attached to keeps its devices
        assert next(r for r in records if r.key == key).devices == devices
    assert sum(1 for r in records if r.queued_s > 0) >= 2
    # Never two live runs on one device: runs that shared a device did not overlap in time.
    for a in records:
        for b in records:
            if a.key < b.key and set(a.devices) & set(b.devices):
                assert a.ended_at <= b.started_at or b.ended_at <= a.started_at, (a.key, b.key, a.devices)
    assert all(len(r.devices) == 1 for r in records)
    no_leftover_servers(runs_dir)
    assert (cli.studies / sid / "report.md").is_file()


def test_a_cluster_study_needs_shared_artifacts_and_mlflow(tmp_path: Path) -> None:
    """Refused when a node is another machine and the artifacts or MLflow are this machine's only."""
    from researcher.runs.ray_launcher import ClusterNotShared, RayLauncher

    class TwoMachines(RayLauncher):
        def __init__(self, ips: list[str]) -> None:
            super().__init__("http://127.0.0.1:8265", ["swarm"])
            self.ips = ips

        def nodes(self) -> list[dict]:
            return [{"node_id": str(i), "node_ip": ip, "resources": {}} for i, ip in enumerate(self.ips)]

    TwoMachines(["127.0.0.1"]).check_shared(tmp_path, "sqlite:///x.db")  # every node is this machine
    with pytest.raises(ClusterNotShared) as refused:
        TwoMachines(["127.0.0.1", "198.51.100.7"]).check_shared(tmp_path, "sqlite:///x.db")
    assert "--artifacts-dir" in str(refused.value) and "MLFLOW_TRACKING_URI" in str(refused.value)


def test_a_ray_address_is_checked_and_an_unreachable_one_fails_fast(cli) -> None:
    """The forms ``--ray-address`` takes; a GCS address nobody listens on fails in seconds (Ray's own
    lookup waits 40 s) and ``researcher start`` says so in one line. The resolution itself, on a real
    cluster: ``test_ray_placement.test_a_study_on_two_ray_nodes``."""
    from researcher.runs import ray_address

    for good in ("127.0.0.1:6379", "head.example:6379", "[::1]:6379", "ray://10.0.0.2:10001", "auto",
                 "http://127.0.0.1:8265/", "https://ray.example"):
        assert ray_address.check(good) == good.rstrip("/")
    for bad in ("", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "tcp://1.2.3.4:5", "a b:1", "ray://"):
        with pytest.raises(ValueError, match="not a Ray cluster address: give HOST:PORT"):
            ray_address.check(bad)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"nothing answers at 127\.0\.0\.1:"):
        ray_address.dashboard_url(f"127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 10
    refused = cli.run("start", "--topic", "Does a larger group size help on letters?", "--study-id", "r",
                      "--ray-address", "head-node", *cli.dirs)
    assert refused.returncode == 2 and "'head-node' is not a Ray cluster address" in refused.stdout, refused.stdout


def test_a_server_bound_off_loopback_gets_a_private_token(tmp_path: Path) -> None:
    from researcher.runs import ray_entry

    state = tmp_path / "server"
    ray_entry._ensure_token("127.0.0.1", ["swarm", "serve", "--state-dir", str(state)])
    assert not (state / "token").exists()  # on loopback the server makes its own
    ray_entry._ensure_token("192.0.2.10", ["swarm", "serve", "--state-dir", str(state)])
    token = (state / "token").read_text()
    assert len(token) >= 24 and (state / "token").stat().st_mode & 0o777 == 0o600
    ray_entry._ensure_token("192.0.2.10", ["swarm", "serve", "--state-dir", str(state)])
    assert (state / "token").read_text() == token  # kept across restarts
