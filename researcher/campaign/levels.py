"""Where a goal campaign's levels come from: each knob's ordered ladder of values, the two levels a screen
tries around the incumbent's, the levels a dose-response refines around a winner, and a configuration
named by what it changes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from researcher.planner import screen
from researcher.types.design import Factor

Config = dict[str, Any]
MIN_LEVELS = 3  # a dose-response's levels at least


class Knob(BaseModel):
    """A knob the search may move: its config key and its ordered ladder of values. ``down_only``: a level
    above the current one costs more runs (group and batch size: episodes a step, and arms are matched on
    episodes), so the screen tries the level below beside the current one."""

    key: str
    ladder: list[Any]
    down_only: bool = False


def ordered(values: Sequence[Any]) -> list[Any]:
    """Distinct values in order: ascending where they are all numbers, else as given."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numeric else distinct


def describe(config: Config, defaults: Config) -> str:
    """A configuration as what it changes from the defaults: ``{lr=0.003, policy_loss='gspo'}``."""
    changed = ", ".join(f"{k}={v!r}" for k, v in sorted(config.items()) if defaults.get(k) != v)
    return "{" + (changed or "the defaults") + "}"


def screen_arms(factors: Sequence[tuple[str, list[Any]]]) -> list[Config]:
    """A screen's arms (overrides): the planner's two-level factorial (a resolution III fraction of 8 arms
    past three knobs), or both levels of a single knob."""
    if len(factors) == 1:
        key, pair = factors[0]
        return [{key: v} for v in pair]
    return screen.arms([Factor(name=key, where="server", levels=pair) for key, pair in factors])


def screen_pair(knob: Knob, current: Any) -> list[Any]:
    """Two levels around ``current`` on the knob's ladder: its neighbours on both sides, or ``current`` and
    its one neighbour at an end of the ladder (``current`` off the ladder: the ladder's first two); a
    ``down_only`` knob: the level below and ``current``."""
    ladder = knob.ladder
    if current not in ladder:
        return list(ladder[:2])
    i = ladder.index(current)
    if knob.down_only and i > 0:
        return [ladder[i - 1], current]
    if 0 < i < len(ladder) - 1:
        return [ladder[i - 1], ladder[i + 1]]
    return [ladder[0], ladder[1]] if i == 0 else [ladder[-2], ladder[-1]]


def refine_levels(knob: Knob, winner: Any, current: Any) -> list[Any]:
    """At least ``MIN_LEVELS`` levels around a confirmed ``winner``: it and its neighbours on the ladder,
    continuing in the direction it moved from ``current`` where the ladder ends on one side."""
    ladder = knob.ladder
    if winner not in ladder or len(ladder) < MIN_LEVELS:
        return list(dict.fromkeys([winner, *ladder]))[:max(MIN_LEVELS, len(ladder))]
    i = ladder.index(winner)
    lo = min(max(i - 1, 0), len(ladder) - MIN_LEVELS)
    if current in ladder and ladder.index(current) < i and i + 1 < len(ladder):
        lo = min(i - 1, len(ladder) - MIN_LEVELS)  # moved up: look one further up as well
    return list(ladder[lo:lo + MIN_LEVELS])
