"""How README's test command (``pytest -n 2``, with ``--dist loadgroup --no-loadscope-reorder`` from
pyproject's addopts) shares the tests between two workers.

Each module goes to one worker whole, so its module-scoped fixtures (servers, model builds, the vLLM
child) are built once. The modules that start a local Ray cluster share one group: they run one after
another on one worker, as two Ray heads on one machine would compete for its cores and ports. Groups
are handed out longest first (Ray's group, then the studies the researcher runs end to end, the rest of
tests/e2e, the soak, tests/integration, then the unit tests: tests/README.md) so both workers finish
together rather than one waiting on a late long module.
"""

from __future__ import annotations

RAY_MODULES = frozenset({
    "tests/e2e/engines/test_verl_trainer.py",
    "tests/e2e/engines/test_verl_server.py",
    "tests/e2e/engines/test_real_model.py",
    "tests/e2e/researcher/test_ray_placement.py",
    "tests/e2e/researcher/test_engines.py",
    "tests/e2e/studies/test_letters.py",
})
LONG_FIRST = ("ray", "tests/e2e/researcher/", "tests/e2e/", "tests/soak/", "tests/integration/")


def group(nodeid: str) -> str:
    """The xdist group of a test: ``ray`` for the Ray modules, else its module's path."""
    module = nodeid.split("::", 1)[0]
    return "ray" if module in RAY_MODULES else module


def rank(nodeid: str) -> int:
    """Where the test's group starts: the long groups first (a stable sort keeps the rest in order)."""
    name = group(nodeid)
    return next((i for i, prefix in enumerate(LONG_FIRST) if name.startswith(prefix)), len(LONG_FIRST))
