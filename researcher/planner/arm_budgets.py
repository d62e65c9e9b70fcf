"""Each arm's training budget: its step target and held-out cadence, matched on episodes consumed.

Some knobs change how many episodes a training step consumes (``group_size`` x ``batch_groups``). Given
the same step target, the larger arm would train on several times the data, and "faster per step" would
be close to guaranteed. So arms are matched on the registered axis: the arm that consumes the most
episodes a step trains ``steps_per_run`` steps, every other arm trains as many steps as it takes to
consume the same episodes, and each arm evaluates its held-out set at the same episode interval (the
cadence scaled by the same ratio), so every arm has as many held-out rounds inside the shared window.
Arms that consume the same episodes a step keep the plan's step target and the client's cadence.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from researcher.findings.records import JsonObject

DEFAULT_EVAL_EVERY = 5  # `swarm run`'s cadence when a client sets no EVAL_EVERY
# ServerConfig's defaults for the keys that set a step's batch (a config that leaves them out gets these).
_BATCH_DEFAULTS = {"group_size": 8, "batch_groups": 4}


@dataclass(frozen=True)
class ArmBudget:
    """One arm's plan: the steps it trains, the episodes those consume and its held-out cadence (None:
    the client's own)."""

    steps: int
    episodes: int
    eval_every: int | None = None


def episodes_per_step(config: Mapping[str, object]) -> int:
    """Episodes one training step consumes under a server config: ``group_size`` x ``batch_groups``."""
    return math.prod(int(str(config.get(key, default))) for key, default in _BATCH_DEFAULTS.items())


def client_eval_every(client: Path) -> int:
    """The client's top-level ``EVAL_EVERY`` literal, else `swarm run`'s default."""
    try:
        tree = ast.parse(client.read_text())
    except (OSError, SyntaxError):
        return DEFAULT_EVAL_EVERY
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EVAL_EVERY" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return DEFAULT_EVAL_EVERY
            return value if isinstance(value, int) and value > 0 else DEFAULT_EVAL_EVERY
    return DEFAULT_EVAL_EVERY


def matched(configs: Mapping[str, JsonObject], steps: int, eval_every: int) -> dict[str, ArmBudget]:
    """Per arm (name -> its server config), the budget that gives every arm the same episodes.

    Unmatched (every arm consumes the same episodes a step): ``steps`` each, the client's cadence. Matched:
    the largest arm trains ``steps``, the others ``ceil(steps x largest / theirs)`` (at least the same
    episodes), and each evaluates every ``eval_every x largest / theirs`` steps (rounded), so the rounds fall
    at about the same episode counts: as many in every arm's window as the largest arm has in its steps
    (7 for 30 steps every 5; runs too short for 4 are judged on the training reward, as before)."""
    per_step = {name: episodes_per_step(config) for name, config in configs.items()}
    if len(set(per_step.values())) <= 1:
        return {name: ArmBudget(steps, steps * n) for name, n in per_step.items()}
    largest = max(per_step.values())
    target = steps * largest
    budgets = {}
    for name, n in per_step.items():
        own = math.ceil(target / n)
        budgets[name] = ArmBudget(own, own * n, max(1, round(eval_every * largest / n)))
    return budgets
