"""The docs site builds, its generated reference matches the code, and README stays short.

``mkdocs build --strict`` fails on a broken link, anchor or snippet; the reference pages
(``docs/reference/``) are compared with what ``docs/gen_reference.py`` writes from the code now, so a
config key, route or command changed without regenerating them fails here with the command to run.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["config.md", "http.md", "cli.md"])
def test_reference_page_matches_the_code(name: str, pages: dict[str, str]) -> None:
    committed = ROOT / "docs" / "reference" / name
    assert committed.is_file(), f"docs/reference/{name} is missing: run {_generator().REGENERATE}"
    assert committed.read_text() == pages[name], (
        f"docs/reference/{name} is stale (the code changed): run {_generator().REGENERATE}")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """What the generator writes now (one tiny-preset app for the HTTP schema, built once)."""
    rendered: dict[str, str] = _generator().render()
    return rendered


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
