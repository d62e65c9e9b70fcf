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


def test_ruff_leaves_out_the_clients_a_study_writes_and_keeps_the_examples() -> None:
    """A ``researcher start`` in a checkout writes its clients under studies/<id>/experiments/; a long line
    there must not fail this build, while the same line in an example still does."""
    bad = "x = 1  # " + "a long line " * 12 + "\n"
    for path, code in (("studies/s1/experiments/e1/client.py", 0), ("studies/examples/letters/client.py", 1)):
        result = subprocess.run([_tool("ruff"), "check", "--no-cache", "--force-exclude", "--stdin-filename", path, "-"],
                                cwd=ROOT, input=bad, capture_output=True, text=True)
        assert result.returncode == code, (path, result.stdout)


def test_mypy_finds_nothing() -> None:
    # The cache lives in .mypy_cache (ignored by its own .gitignore): a warm run takes a second, a cold one
    # (CI's clean clone) about 15 s of CPU.
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
