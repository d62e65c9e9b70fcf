"""End to end: `swarm serve --model tiny --config calculator/config.toml` + `swarm run calculator/client.py`
as real processes. The client's warm-up runs through ``POST /api/v1/control/sft``, then GRPO trains on
multi-turn tool-use episodes: each episode is 4-6 model calls and the server merges an episode's calls
into about one sample (default run); the reward rises (``-m study``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ROOT, ServeProcess, study_run

from swarm.client import SwarmClient

CALCULATOR = ROOT / "studies" / "examples" / "calculator"
BUDGET_S = 300.0  # the warm-up takes about 50 s of it; the rise took 90 s once, 270-290 s (or more) now
RISE = 0.04  # last 10 steps vs the first 5; the noise of that difference is about 0.025
MIN_STEPS = 15


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _rise(rewards: list[float]) -> float:
    return _mean(rewards[-10:]) - _mean(rewards[:5])


def _train(new_server: Callable[..., ServeProcess], tmp_path: Path, done: Callable[[list[float]], bool],
           budget_s: float) -> tuple[list[dict[str, float]], str, float]:
    """Serve and run the calculator study until ``done(rewards)`` or the budget: its steps' metrics,
    the client's log and the seconds it took."""
    server = new_server(config=CALCULATOR / "config.toml")
    start = time.monotonic()
    steps: list[dict[str, float]] = []
    with study_run(CALCULATOR / "client.py", server, tmp_path / "run.log") as run, \
            SwarmClient(server.url, token=server.token) as client:
        while time.monotonic() - start < budget_s and run.poll() is None:
            time.sleep(2.0)
            steps = [m.metrics for m in client.metrics() if m.step > 0]  # row 0: the baseline evaluation
            if done([m["train/reward_mean"] for m in steps]):
                break
    return steps, (tmp_path / "run.log").read_text(errors="replace"), time.monotonic() - start


def _multi_turn_and_merged(steps: list[dict[str, float]], output: str) -> None:
    assert "warm-up on 400 examples" in output and "Traceback" not in output, output[-2000:]
    # Multi-turn: every episode makes 4-6 calls (3-5 operations plus the answer; more with retries)...
    assert all(m["episode/turns"] >= 4 for m in steps)
    # ...and merging trains each episode as about one sample (a reply whose bytes do not re-encode
    # to the sampled tokens forks, which is rare and counted).
    assert _mean([m["context/samples_per_episode"] for m in steps]) < 1.2
    assert sum(m["context/drift_forks"] for m in steps) < 0.2 * sum(m["train/episodes"] for m in steps)


@pytest.mark.study  # minutes of CPU: long acceptance run, `pytest -m study` (CI time)
@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + 120)
def test_calculator_trains_multi_turn_episodes_as_one_sample_each(new_server: Callable[..., ServeProcess],
                                                                  tmp_path: Path) -> None:
    """The default run: the warm-up and MIN_STEPS GRPO steps of multi-turn tool episodes, each merged."""
    steps, output, elapsed = _train(new_server, tmp_path, lambda rewards: len(rewards) >= MIN_STEPS, BUDGET_S)
    assert len(steps) >= MIN_STEPS, f"only {len(steps)} steps in {elapsed:.0f} s\n{output[-2000:]}"
    _multi_turn_and_merged(steps, output)


@pytest.mark.study
@pytest.mark.timeout(BUDGET_S + 120)  # the budget ends the test, with its message, not pytest's timeout
def test_calculator_trains_multi_turn_with_reward_rising(new_server: Callable[..., ServeProcess],
                                                          tmp_path: Path) -> None:
    """The reward rises (opt-in, ``-m study``): on this machine the rise after the warm-up is small and
    slow (0.38 -> 0.43 in 122 steps, at this commit and at 11-23's alike), so it is a study, not a
    default-run check."""
    steps, output, elapsed = _train(new_server, tmp_path,
                                    lambda rewards: len(rewards) >= MIN_STEPS and _rise(rewards) >= RISE, BUDGET_S)
    rewards = [m["train/reward_mean"] for m in steps]
    assert len(rewards) >= MIN_STEPS, f"only {len(rewards)} steps in {elapsed:.0f} s\n{output[-2000:]}"
    print(f"calculator: {len(rewards)} steps in {elapsed:.0f} s, first5={_mean(rewards[:5]):.3f} "
          f"last10={_mean(rewards[-10:]):.3f}", file=sys.stderr)
    assert _rise(rewards) >= RISE, f"rewards {[round(r, 3) for r in rewards]}\n{output[-2000:]}"
    _multi_turn_and_merged(steps, output)
