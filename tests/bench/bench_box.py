"""Benchmark: the OS sandbox's cost on a letters run, as training-step time boxed / unboxed.

One ``swarm serve --model tiny`` with the letters config; then ``--rounds`` pairs of ``swarm run
studies/examples/letters/client.py --episodes N``, unboxed and ``--box`` in turn on the same server
(alternating, so a load change on a shared machine meets both alike). Each round's step time is the
run's own seconds (its summary line: the box's start-up is not a training step) over the training
steps the server took meanwhile. The boxed client's traffic goes through the box's port hand-off
(``swarm.box._forward``), its interpreter runs under the seccomp filter and the audit hook.

Ends with ``RESULT box_step_time_ratio=<median boxed / median unboxed step seconds>`` (target: at most 1.05).

    .venv/bin/python tests/bench/bench_box.py [--episodes 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def _step(url: str, state_dir: Path) -> int:
    from swarm.client import SwarmClient

    with SwarmClient(url, token_file=state_dir / "token", retry_for_s=30) as client:
        return client.status().step


def _round(url: str, state_dir: Path, run_dir: Path, episodes: int, boxed: bool) -> float:
    """One client run; seconds per training step taken while it ran."""
    before = _step(url, state_dir)
    argv = [*SWARM, "run", str(LETTERS / "client.py"), "--server", url, "--state-dir", str(state_dir),
            "--episodes", str(episodes), "--eval-every", "0", *(["--box"] if boxed else [])]
    done = subprocess.run(argv, cwd=run_dir, capture_output=True, text=True, timeout=900)
    found = SUMMARY.search(done.stdout)
    if done.returncode != 0 or found is None:
        sys.exit(f"{'boxed' if boxed else 'unboxed'} run failed:\n{done.stderr[-3000:]}")
    steps = _step(url, state_dir) - before
    seconds = float(found.group(3))
    print(f"{'boxed  ' if boxed else 'unboxed'} {episodes} episodes: {seconds:.2f} s, {steps} steps, "
          f"{seconds / max(steps, 1):.3f} s/step", flush=True)
    return seconds / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
            plain, boxed = [], []
            for _ in range(args.rounds):
                plain.append(_round(url, state_dir, run_dir, args.episodes, boxed=False))
                boxed.append(_round(url, state_dir, run_dir, args.episodes, boxed=True))
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"RESULT box_step_time_ratio={statistics.median(boxed) / statistics.median(plain):.3f}")


if __name__ == "__main__":
    main()
