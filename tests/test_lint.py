"""Lint and types are part of the build: ruff over the repository ([tool.ruff]) and mypy over swarm/ and
researcher/ ([tool.mypy]), both from this environment's bin (the test extra installs them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is part of the test extra: pip install -e '.[test]'")
    return found


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    # The cache lives in .mypy_cache (ignored by its own .gitignore): a warm run takes a second, a cold one
    # (CI's clean clone) about 15 s of CPU.
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
