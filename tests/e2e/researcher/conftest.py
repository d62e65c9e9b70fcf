"""Fixtures for the researcher's end-to-end tests: the real CLI as a subprocess, with tmp roots."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import free_port
from tiny_swarm import tiny_server

REPO = Path(__file__).resolve().parents[3]


class Cli:
    """Runs `researcher …` as a real process with the study roots under a tmp dir.

    ``cwd`` is the repository unless a test points it at a folder of its own: the researcher takes
    example studies from ``./studies/examples`` when the working directory has one."""

    def __init__(self, tmp_path: Path, env: dict[str, str], cwd: Path = REPO) -> None:
        self.studies = tmp_path / "studies"
        self.artifacts = tmp_path / "artifacts"
        self.env = env
        self.cwd = cwd

    @property
    def dirs(self) -> list[str]:
        return ["--studies-dir", str(self.studies), "--artifacts-dir", str(self.artifacts)]

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-c", "from researcher.cli import main; main()", *args]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.env, cwd=self.cwd, capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(self.argv(*args), env=self.env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RESEARCHER_LLM") and k not in ("MLFLOW_TRACKING_URI", "OPENAI_API_KEY", "SWARM_TOKEN")}
    env.update({"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true",
                "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    return Cli(tmp_path, env)


@pytest.fixture
def no_leftover_servers() -> Callable[[Path], None]:
    """A check that every server and client a study started has exited."""
    from researcher.runs import detached
    from researcher.runs import record as runs

    def check(runs_dir: Path) -> None:
        for record in runs.all_records(runs_dir):
            assert not detached.alive(record.server_pid, record.server_started), record.key
            assert not detached.alive(record.client_pid, record.client_started), record.key

    return check


@pytest.fixture
def swarm_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real `swarm serve --model tiny` on loopback (an "existing server" for --server); (url, token)."""
    token = "test-control-token"
    with tiny_server(tmp_path, free_port(), REPO / "studies" / "examples" / "letters" / "config.toml", token) as url:
        yield url, token
