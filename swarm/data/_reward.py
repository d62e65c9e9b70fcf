"""Rewards for data rows: verl's scorers by ``data_source``, exact match, or a function of the user's.

``--reward`` takes:

- ``verl`` (the default): ``verl.utils.reward_score.default_compute_score(data_source, text,
  ground_truth, extra_info)``, the scorer verl picks by each row's ``data_source`` (``openai/gsm8k``
  expects ``#### <answer>``; the MATH sources a boxed answer; …). verl (and with it torch) is imported
  only when this reward is used. A row with no ``data_source`` is scored by ``exact``.
- ``exact``: 1.0 when the reply, stripped, equals the ground truth as a string, else 0.0.
- any other name: verl's scorer of that ``data_source`` for every row (``--reward openai/gsm8k``).
- ``PATH:FUNC``: ``FUNC(text, row) -> float`` from the Python file ``PATH``; ``row`` is the task dict
  (``prompt``, ``ground_truth``, ``data_source``, ``extra_info``, ``answer``).

``probe`` runs the reward over the first rows before anything is claimed, so a reward that raises or
returns a non-number stops the run with the row that broke it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swarm.data._rows import DataError, DataTask, Row

Reward = Callable[[str, DataTask], float]
PROBE_ROWS = 8


def _exact(text: str, task: DataTask) -> float:
    return 1.0 if text.strip() == str(task["ground_truth"]).strip() else 0.0


def _verl(source: str | None) -> Reward:
    from verl.utils.reward_score import default_compute_score  # heavy (imports torch): only when used

    def score(text: str, task: DataTask) -> float:
        data_source = source or task.get("data_source")
        if not data_source:
            return _exact(text, task)
        result = default_compute_score(data_source, text, task["ground_truth"], task.get("extra_info") or {})
        return result["score"] if isinstance(result, dict) else result

    return score


def load_reward(spec: str = "verl") -> Reward:
    """The reward ``spec`` names (see the module docstring); ``ValueError`` when it cannot be loaded."""
    if spec == "exact":
        return _exact
    if spec == "verl":
        return _verl(None)
    path, sep, name = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return _user_function(Path(path), name, "reward")
    return _verl(spec)


def _user_function(path: Path, name: str, what: str) -> Any:
    """``name`` from the Python file ``path`` (loaded from its path, so an edited file is re-read)."""
    if not path.is_file():
        raise ValueError(f"--{what} {path}:{name}: no such file {path}")
    module_name = f"swarm_data_{what}_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path.resolve())
    if spec is None or spec.loader is None:
        raise ValueError(f"--{what} {path}:{name}: cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's own module failed to import: show it plainly
        raise ValueError(f"--{what} {path}:{name}: importing {path} raised {type(exc).__name__}: {exc}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"--{what} {path}:{name}: {path} defines no function {name!r}")
    return function


def as_reward(value: Any) -> float:
    """A scorer's result as a finite float; ``ValueError`` when it is none."""
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned {value!r:.80}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"returned {number}, not a finite number")
    return number


def probe(reward: Reward, rows: Sequence[Row], count: int = PROBE_ROWS) -> None:
    """Score the first ``count`` rows with an empty reply and with the ground truth as the reply;
    ``DataError`` at the first row where the reward raises or returns no finite number."""
    for row in rows[:count]:
        task = row.task(f"probe-{row.number}")
        for text in ("", str(row.ground_truth)):
            try:
                value = reward(text, task)
            except Exception as exc:
                raise DataError(row.file, row.number, f"the reward raised {type(exc).__name__}: {exc}") from exc
            try:
                as_reward(value)
            except ValueError as exc:
                raise DataError(row.file, row.number, f"the reward {exc} (for the reply {text!r:.40})") from None
