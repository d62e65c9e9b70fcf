"""Values of a knob near the ones already run: midpoints on its scale (geometric for log-scale knobs),
the untested neighbours of the best value, rounded as the knob is written. The offline planner's
refinement and sweep steps choose from these; values stay within the knob's bounds.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from researcher.planner import catalog
from researcher.planner.topic import MIN_SWEEP
from researcher.types.design import same_value

__all__ = ["around", "mid", "rounded", "spread", "untested_neighbour"]


def rounded(knob: catalog.Knob, value: float) -> Any:
    return round(value) if knob.kind == "int" else float(f"{value:.2g}")


def mid(knob: catalog.Knob, a: float, b: float) -> Any:
    return rounded(knob, math.sqrt(a * b) if knob.log_scale and min(a, b) > 0 else (a + b) / 2)


def spread(knob: catalog.Knob, a: Any, b: Any) -> list[Any]:
    """At least 4 values from a to b: the ends, the catalog's values between, midpoints of the widest gaps."""
    low, high = sorted((a, b))
    points = [low, high, *[v for v in knob.ladder if low < v < high]]
    while len(points) < MIN_SWEEP:
        points.sort()
        gaps = list(itertools.pairwise(points))
        x, y = max(gaps, key=lambda g: (g[1] / g[0]) if knob.log_scale and g[0] > 0 else g[1] - g[0])
        between = mid(knob, x, y)
        if any(same_value(between, p) for p in points):
            break
        points.append(between)
    return sorted(points)


def around(knob: catalog.Knob, best: Any, tested: list[Any]) -> list[Any]:
    """Untested values next to the best of a sweep: midpoints towards its tested neighbours, or one
    step outward (within the knob's range) where the best is at the edge of what was tested."""
    if knob.kind not in ("int", "float") or not isinstance(best, (int, float)) or isinstance(best, bool):
        return []
    numbers = sorted(v for v in tested if isinstance(v, (int, float)) and not isinstance(v, bool))
    lower = [v for v in numbers if v < best and not same_value(v, best)]
    upper = [v for v in numbers if v > best and not same_value(v, best)]
    low, high = knob.bounds or (-math.inf, math.inf)
    candidates = []
    for near, far in ((lower[-1] if lower else None, upper[0] if upper else None),
                      (upper[0] if upper else None, lower[-1] if lower else None)):
        if near is not None:
            candidates.append(mid(knob, near, best))
        elif far is not None:  # best is at the edge: step outward by the same ratio (or distance)
            step = best * best / far if knob.log_scale and far > 0 and best > 0 else 2 * best - far
            candidates.append(rounded(knob, min(max(step, low), high)))
    out: list[Any] = []
    for v in candidates:
        if not any(same_value(v, x) for x in [best, *numbers, *out]) and low <= v <= high:
            out.append(v)
    return sorted(out)


def untested_neighbour(knob: catalog.Knob, best: Any, tested: list[Any]) -> Any:
    """The ladder value next to ``best`` not yet tested, preferring the direction that won so far."""
    ladder = list(knob.ladder)
    if best not in ladder:
        return None
    i = ladder.index(best)
    tested_set = {repr(v) for v in tested}
    # Prefer moving further in the direction that won: if best is above the other tested values, go up.
    others = [ladder.index(v) for v in tested if v in ladder and v != best]
    order = [i + 1, i - 1] if not others or max(others) < i else [i - 1, i + 1]
    for j in order:
        if 0 <= j < len(ladder) and repr(ladder[j]) not in tested_set:
            return ladder[j]
    return None
