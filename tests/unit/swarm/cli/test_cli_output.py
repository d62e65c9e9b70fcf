"""``swarm`` output into a pipe: whole log lines, not rich's 80-column wrap (real CLI subprocess)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support import free_port

ROOT = Path(__file__).resolve().parents[4]


def test_log_lines_reach_a_pipe_unbroken() -> None:
    port = free_port()  # nobody listens on it: the client logs its first failed attempt
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "SWARM_TOKEN")}
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "status", f"http://127.0.0.1:{port}", "--token", "t"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # the CLI gives up after ~5 s, so this never blocks for long
    finally:
        proc.kill()
        proc.wait()
    line = first.rstrip("\n")
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] INFO +swarm\.client\._transport: GET /api/v1/status failed "
                        r"\(.+\); retrying in [\d.]+ s", line), first
    assert len(line) > 80  # one line although wider than rich's default width off a terminal


def test_swarm_metrics_shows_the_judged_keys_first_and_hides_all_zero_ones() -> None:
    from swarm.cli.observe import _default_keys
    from swarm.protocol import StepMetrics

    steps = [StepMetrics(step=s, policy_version=s, time=float(s), metrics={
        "train/loss": 0.1, "train/reward_mean": 0.2 * s, "eval/reward_mean": 0.1 * s, "context/forks": 0.0,
        "context/merged_fraction": 0.0, "perf/step_s": 1.5, "rollout/tokens_mean": 12.0 + s}) for s in range(1, 4)]
    available = sorted({k for s in steps for k in s.metrics})
    shown = _default_keys(steps, available)
    assert shown[:3] == ["eval/reward_mean", "train/reward_mean", "train/loss"]
    assert not any(k.startswith("context/") for k in shown) and "perf/step_s" in shown
