"""The dependency rules (README "What it is": who may import whom), checked by import-linter on the real package graph."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is part of the test extra"
    result = subprocess.run([lint, "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_client_imports_without_torch() -> None:
    """A laptop client must start fast: importing swarm.client may not pull torch or the server."""
    code = (
        "import sys, swarm.client; "
        "bad = [m for m in ('torch', 'transformers', 'verl', 'swarm.server', 'fastapi') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
