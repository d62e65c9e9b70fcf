"""The client fixtures the scripted planner writes (``tests/e2e/researcher/clients/``) are valid study
clients: they pass the import check and the data probe, declare their reward range, and take the
factor levels the researcher writes into each experiment's copy.

What their rewards do on the untrained model (``vowels`` and ``lowercase`` vary within a group;
``vowels`` with an exact-match reward is constant at 0, with a percentage it leaves its declared
range) is what the end-to-end studies in ``test_open_studies.py`` check through the researcher's
own checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from researcher.runs.sandbox import check_client
from researcher.study import files as studyfiles
from swarm.client import load_study, probe_study

CLIENTS = Path(__file__).parent / "clients"


@pytest.mark.parametrize("path", sorted(CLIENTS.glob("*.py")), ids=lambda p: p.stem)
def test_fixture_is_a_valid_study_client(path: Path) -> None:
    source = path.read_text()
    assert check_client(source, path.name) is None
    probe = probe_study(path)  # tasks(seed) deterministic per seed, seeds differ, heldout() disjoint
    assert probe.ok, probe.problems
    module = load_study(path)
    assert module.REWARD_RANGE == (0.0, 1.0) and isinstance(module.FACTORS, dict)
    flipped = {name: _other_level(level) for name, level in module.FACTORS.items()}
    assert check_client(studyfiles.set_factors(source, flipped), path.name) is None


def _other_level(level: Any) -> Any:
    return {True: False, False: True, "plain": "hint", "hint": "plain"}[level]
