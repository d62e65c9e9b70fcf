"""Where the OS sandbox cannot be built (no bubblewrap on PATH), LLM-written study code is refused unless the
study allows it unboxed; the example clients the offline planner runs are not refused. Checked in a fresh
interpreter whose PATH holds no `bwrap` (the probe reads the machine, not a flag)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json
from researcher.runs import sandbox
print(json.dumps([sandbox.box_flags(), sandbox.unboxed_refusal(llm_written=True, allow_unboxed=False),
                  sandbox.unboxed_refusal(llm_written=True, allow_unboxed=True),
                  sandbox.unboxed_refusal(llm_written=False, allow_unboxed=False)]))
"""


def test_llm_written_code_is_refused_without_the_box_unless_allowed() -> None:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # the venv's bin only: no bwrap
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    flags, refused, allowed, offline = json.loads(done.stdout.strip().splitlines()[-1])
    assert flags == [] and allowed is None and offline is None
    assert refused.startswith("the OS sandbox for LLM-written study code cannot be built on this machine: bubblewrap "
                              "is not installed") and "--allow-unboxed" in refused
