"""The researcher's layering: readers load no graph, one writer of run.json, one framing per start."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from researcher.planner.offline import OfflinePlanner

REPO = Path(__file__).resolve().parents[3]


def test_status_and_scheduler_load_no_graph() -> None:
    """`researcher status`, `list` and the daemon read a phase without importing LangGraph's graph."""
    loaded = ("langgraph.graph", "researcher.session.graph", "researcher.session.nodes", "researcher.session.runner")
    code = ("import sys, researcher.cli, researcher.operations.scheduler, researcher.operations.daemon; "
            f"print(','.join(m for m in {loaded!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_only_the_launcher_writes_run_records() -> None:
    """run.json has one writer: the launcher (its Ray placement is a subclass of the local one; its smoke
    run, ``Launcher.smoke``, records the smoke server it spawned, so a killed session's successor stops it)."""
    writers = set()
    for path in (REPO / "researcher").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "save" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "runs":
                writers.add(path.relative_to(REPO).as_posix())
    assert writers == {"researcher/runs/launcher.py", "researcher/runs/ray_launcher.py", "researcher/runs/smoke.py"}


def test_offline_planner_frames_a_topic_once() -> None:
    planner = OfflinePlanner(["letters"])
    first = planner.frame("Does a larger group size make letters learn faster?", "catalog")
    assert planner.frame("Does a larger group size make letters learn faster?", "catalog") is first
