"""The soak (``tests/soak/soak.py``, issue #39): a study under seeded random SIGKILLs of every process
kind, then the audit: nothing lost or trained twice, no run launched twice, MLflow equal to run.json,
nothing left behind, the same Answer class as an undisturbed run.

The short variant runs by default (about 4 minutes on 2 cores: an undisturbed reference study, then
short studies under chaos until every kind has been killed at least once); the long ones
(``-m soak``) are the issue's acceptance runs, an hour each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).with_name("soak.py")
KINDS = ("client", "server", "researcher", "daemon", "mlflow")


def _soak(*args: str, timeout: float) -> tuple[dict[str, float], dict[str, int], str]:
    done = subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    result = re.search(r"^RESULT (.*)$", output, re.M)
    assert result, output[-4000:]
    values = {k: float(v) for k, v in (item.split("=") for item in result.group(1).split())}
    kills = re.search(r"^KILLS (.*)$", output, re.M)
    per_kind = {k: int(v) for k, v in (item.split("=") for item in kills.group(1).split())} if kills else {}
    return values, per_kind, output


def _assert_clean(values: dict[str, float], output: str) -> None:
    for counter in ("lost", "twice", "duplicate_runs", "mlflow_gaps", "orphans"):
        assert values[counter] == 0, f"{counter}={values[counter]}\n{output[-4000:]}"
    assert values["verdict_equal"] == 1, output[-4000:]
    assert values["rss_growth_mb"] < 150, output[-4000:]


@pytest.mark.study  # minutes of CPU: long acceptance run, `pytest -m study` (CI time)
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_soak_every_kind_killed_nothing_lost_same_answer() -> None:
    values, per_kind, output = _soak("--duration", "30s", "--every-kind", "--seed", "7", "--steps", "5",
                                     "--seeds", "1", "--interval", "4", "9", "--every", "10", timeout=840)
    print(output[-2500:])
    assert all(per_kind.get(kind, 0) >= 1 for kind in KINDS), (per_kind, output[-4000:])
    _assert_clean(values, output)


@pytest.mark.soak
@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("args", [("--seed", "1"), ("--seed", "2", "--pool-workers", "2")], ids=["seed1", "pool2"])
def test_long_soak(args: tuple[str, ...]) -> None:
    values, _per_kind, output = _soak("--duration", "60m", "--every-kind", *args, timeout=3 * 3600 - 60)
    print(output[-3000:])
    _assert_clean(values, output)
