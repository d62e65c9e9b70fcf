"""Benchmark: the OS sandbox's cost on a letters run, as training-step time boxed / unboxed.

One ``swarm serve --model tiny`` with the letters config; then ``--rounds`` pairs of ``swarm run
studies/examples/letters/client.py --episodes N``, one unboxed and one ``--box``, on the same server. The
pairs alternate their order (unboxed first, then boxed first: a drifting load or a learning policy meets
both alike). A run's step time is its own seconds (its summary line: the box's start-up is not a
training step) times the episodes a step consumes (``group_size x batch_groups``), over the episodes it
finished: counting the server's steps instead would add a whole step's error to a round of eight. The
boxed client's traffic goes through the box's port hand-off (``swarm.box._forward``), its interpreter
runs under the seccomp filter and the audit hook.

Also printed: each pair's ratio, and the CPU seconds an episode costs the client's side (every process
``swarm run`` started, the box's included), boxed against unboxed.

Ends with ``RESULT box_step_time_ratio=<geometric mean of the pairs' boxed / unboxed step times>
ci_low=… ci_high=… pairs=…`` (target: at most 1.05), the 95% interval from the pairs' spread (a t
interval on their log ratios): a letters step's time varies by 10% from round to round, so a few pairs
cannot tell 1.00 from 1.05.

    .venv/bin/python tests/bench/bench_box.py [--episodes 1024] [--rounds 12]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

from scipy import stats

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
ROOT = Path(__file__).resolve().parents[2]
LETTERS = ROOT / "studies" / "examples" / "letters"
SWARM = [sys.executable, "-m", "swarm.cli"]
SUMMARY = re.compile(r"finished=(\d+) aborted=(\d+) mean_reward=\S+ seconds=([\d.]+)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _episodes_per_step() -> int:
    config = tomllib.loads((LETTERS / "config.toml").read_text())
    return int(config["group_size"]) * int(config["batch_groups"])


def _round(url: str, state_dir: Path, run_dir: Path, episodes: int, boxed: bool) -> tuple[float, float]:
    """One client run: (seconds a training step took, client-side CPU seconds an episode)."""
    argv = [*SWARM, "run", str(LETTERS / "client.py"), "--server", url, "--state-dir", str(state_dir),
            "--episodes", str(episodes), "--eval-every", "0", *(["--box"] if boxed else [])]
    before = _children_cpu_s()
    with subprocess.Popen(argv, cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        watcher = _DescendantsCpu(proc.pid)
        stdout, stderr = proc.communicate(timeout=900)
        watcher.stop()
    cpu_s = _children_cpu_s() - before + watcher.cpu_s
    found = SUMMARY.search(stdout)
    if proc.returncode != 0 or found is None:
        sys.exit(f"{'boxed' if boxed else 'unboxed'} run failed:\n{stderr[-3000:]}")
    finished, seconds = int(found.group(1)), float(found.group(3))
    step_s = seconds * _episodes_per_step() / max(finished, 1)
    print(f"{'boxed  ' if boxed else 'unboxed'} {finished} episodes: {seconds:.2f} s, {step_s:.3f} s/step, "
          f"client cpu {1000 * cpu_s / max(finished, 1):.1f} ms/episode", flush=True)
    return step_s, cpu_s / max(finished, 1)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _DescendantsCpu:
    """The CPU seconds of ``pid``'s descendants (not ``pid`` itself), read from /proc every 0.2 s: the
    boxed interpreter's time never reaches this process's rusage (bubblewrap's init does not pass it up),
    so its last 0.2 s at most go uncounted."""

    def __init__(self, pid: int) -> None:
        self.pid, self.seen, self._stop = pid, dict[int, float](), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @property
    def cpu_s(self) -> float:
        return sum(self.seen.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.wait(0.2):
            stats = {}
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:  # fields after the command's closing parenthesis: state, ppid, ... utime, stime
                        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    except (OSError, IndexError):
                        continue
                    stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
            family = {self.pid}
            while grown := {pid for pid, (ppid, _) in stats.items() if ppid in family} - family:
                family |= grown
            for pid in family - {self.pid}:
                self.seen[pid] = max(self.seen.get(pid, 0.0), stats[pid][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1024, help="a run's episodes (256: about 3 s, timed to 0.1 s)")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    ratios, cpu = [], {False: 0.0, True: 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        state_dir, run_dir = Path(tmp) / "state", Path(tmp) / "run"
        run_dir.mkdir()
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([*SWARM, "serve", "--model", "tiny", "--config", str(LETTERS / "config.toml"),
                                   "--state-dir", str(state_dir), "--port", str(port), "--threads", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 180
            while not (state_dir / "token").exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            _round(url, state_dir, run_dir, 64, boxed=False)  # warm-up: compile caches, first steps
            for index in range(args.rounds):
                order = (False, True) if index % 2 == 0 else (True, False)
                step_s = {}
                for boxed in order:
                    step_s[boxed], cpu_episode = _round(url, state_dir, run_dir, args.episodes, boxed)
                    cpu[boxed] += cpu_episode / args.rounds
                ratios.append(step_s[True] / step_s[False])
                print(f"pair {index + 1}: boxed / unboxed = {ratios[-1]:.3f}", flush=True)
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"pairs' ratios: {min(ratios):.3f} to {max(ratios):.3f}, median {statistics.median(ratios):.3f}; "
          f"client cpu an episode: boxed {1000 * cpu[True]:.1f} ms, unboxed {1000 * cpu[False]:.1f} ms "
          f"(x{cpu[True] / cpu[False]:.2f})")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    print(f"RESULT box_step_time_ratio={math.exp(mean):.3f} ci_low={math.exp(mean - half):.3f} "
          f"ci_high={math.exp(mean + half):.3f} pairs={len(ratios)}")


if __name__ == "__main__":
    main()
