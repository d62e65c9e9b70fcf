"""A plan checked against its framing's design, before any run: every experiment sets every framed factor
where it belongs (server config keys in ``overrides``, client factors in ``factors``), and a factorial
runs its framed levels, both of each, no combination twice.

``plan_experiments`` asks the planner to repair a plan this finds fault with, in the same round as the
topic's own checks (``researcher.planner.topic.plan_complaint``); the effects a factorial's runs show are
``researcher.evidence.factorial``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from researcher.planner.catalog import CONFIG_KEYS
from researcher.types.design import Factor, Framing, Plan, same_value

__all__ = ["design_complaint"]


def design_complaint(framing: Framing, plan: Plan) -> str | None:
    """Why a plan does not run the framed design; None when it does.

    Every experiment sets every framed factor (server factors in ``overrides``, client factors in
    ``factors``); client factor names never go to the server; a factorial has two or more factors, each
    at its framed levels only, with both levels run and no combination twice."""
    problems: list[str] = []
    client = framing.client_factors()
    for exp in plan.experiments:
        misplaced = [k for k in exp.overrides if k in client]
        if misplaced:
            problems.append(f"experiment {exp.name} sets client factor(s) {', '.join(misplaced)} in `overrides` (server "
                            "config keys only): set them in `factors`")
        served = [k for k in exp.factors if k in CONFIG_KEYS]
        if served:
            problems.append(f"experiment {exp.name} sets server config key(s) {', '.join(served)} in `factors`: set "
                            "them in `overrides`")
        unset = [f.name for f in framing.factors if f.name not in _settings(f, exp.overrides, exp.factors)]
        if unset:
            problems.append(f"experiment {exp.name} does not set factor(s) {', '.join(unset)} (every experiment sets "
                            "every factor explicitly)")
    if plan.shape == "factorial":
        if len(framing.factors) < 2:
            problems.append("a factorial plan needs a framing with two or more factors; this framing has "
                            f"{len(framing.factors)}: use shape comparison or sweep")
        seen: dict[str, str] = {}
        for exp in plan.experiments:
            levels = []
            for f in framing.factors:
                value = _settings(f, exp.overrides, exp.factors).get(f.name)
                if not any(same_value(value, level) for level in f.levels):
                    problems.append(f"experiment {exp.name} sets {f.name} = {value!r}, not one of its framed levels "
                                    f"{f.levels}")
                levels.append(repr(value))
            combination = json.dumps(levels)
            if combination in seen:
                problems.append(f"experiments {seen[combination]} and {exp.name} run the same combination of levels")
            seen.setdefault(combination, exp.name)
        for f in framing.factors:
            run = [_settings(f, e.overrides, e.factors).get(f.name) for e in plan.experiments]
            missing = [level for level in f.levels[:2] if not any(same_value(level, v) for v in run)]
            if missing:
                problems.append(f"factor {f.name} never runs at level(s) {missing}: a factorial runs both levels")
    return "; ".join(_unique(problems)) + "." if problems else None


def _settings(factor: Factor, overrides: Mapping[str, Any], factors: Mapping[str, Any]) -> Mapping[str, Any]:
    return overrides if factor.where == "server" else factors


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
