"""Engine tests run real ``swarm serve --engine vllm`` / ``--trainer verl`` processes on the tiny preset."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
