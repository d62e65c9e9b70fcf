"""Factorial designs: main effects and two-factor interactions with 95% intervals (the plan's checks of a
factorial, before any run, are ``researcher.planner.design_check``'s).

A factorial varies several factors at two levels each (server config keys and client-side factors
alike) over every combination (2^k) or a fraction of them. Arms are the configurations (server
overrides + client factor levels: ``arm_settings``), scored by ``researcher.evidence.analysis`` with per-seed
areas under the reward curve; here each effect is a contrast of arm means on the verdict's axis:

- main effect of A = mean of the arms at A's high level − mean of the arms at its low level (the
  levels as the framing lists them: first = low);
- interaction A×B = mean of the arms where A and B are both high or both low − mean of the others
  (half the change of A's effect when B goes from low to high, as in Box, Hunter & Hunter).

With contrast weights c_i over arms of mean ȳ_i, sample variance s_i² and n_i seeds, the estimate is
Σ c_i ȳ_i with variance Σ c_i² s_i²/n_i and Welch–Satterthwaite degrees of freedom
(Σ c_i² s_i²/n_i)² / Σ (c_i² s_i²/n_i)²/(n_i − 1); an arm with one seed leaves the effect without an
interval. In a fractional design some effects share one contrast (aliases): they are reported once
each, with the names they cannot be told apart from.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from researcher.evidence import stats
from researcher.evidence.analysis import AXIS_TEXT
from researcher.findings.records import Effect, Evidence, JsonObject
from researcher.types.design import Experiment, Factor, same_value

__all__ = ["arm_settings", "effects", "effects_section", "mlflow_values"]


def arm_settings(experiment: Experiment) -> JsonObject:
    """What makes an arm: its server overrides and its client factor levels (as ``PlannedExperiment.settings``)."""
    return {**experiment.overrides, **experiment.factors}


# ---------------------------------------------------------------------- the analysis


def effects(study: Evidence, factors: Sequence[Factor]) -> list[Effect]:
    """Main effects and two-factor interactions of the two-level ``factors`` on the study's verdict axis.

    ``study`` is ``analysis.evidence``'s output: its ``arms`` carry ``overrides`` (the arms' settings)
    and per-seed ``scores`` per axis. Arms at levels outside the design, and arms without a usable run,
    are left out. Fewer than two factors: no effects (``[]``)."""
    design = [f for f in factors if len(f.levels) == 2]
    if len(design) < 2:
        return []
    axis = study.axis
    arms: list[tuple[dict[str, int], list[float]]] = []
    for row in study.arms:
        scores = list(row.scores.get(axis) or [])
        signs = {f.name: _sign(f, row.overrides) for f in design}
        if scores and all(s != 0 for s in signs.values()):
            arms.append((signs, scores))
    contrasts: list[tuple[str, str, list[str], list[int]]] = []
    for f in design:
        contrasts.append((f.name, "main", [f.name], [signs[f.name] for signs, _ in arms]))
    for a, b in itertools.combinations(design, 2):
        contrasts.append((f"{a.name}×{b.name}", "interaction", [a.name, b.name],
                          [signs[a.name] * signs[b.name] for signs, _ in arms]))
    out = []
    levels = {f.name: f.levels for f in design}
    for name, kind, names, column in contrasts:
        aliases = [other for other, _, _, col in contrasts if other != name and col and
                   (col == column or col == [-s for s in column])]
        out.append(Effect(name=name, key="_x_".join(names), kind=kind, factors=names,
                          levels=[levels[n] for n in names], axis=axis, arms=len(arms), aliases=aliases,
                          **_contrast(column, [scores for _, scores in arms])))
    return out


def _sign(factor: Factor, settings: Mapping[str, object]) -> int:
    """-1 at the low (first) level, +1 at the high (second), 0 when the arm is outside the design."""
    if factor.name not in settings:
        return 0
    value = settings[factor.name]
    return -1 if same_value(value, factor.levels[0]) else 1 if same_value(value, factor.levels[1]) else 0


def _contrast(column: Sequence[int], samples: Sequence[Sequence[float]]) -> dict[str, float | bool | None]:
    """The contrast mean(+) − mean(−) of the arms' means, with its Welch–Satterthwaite 95% interval."""
    plus, minus = column.count(1), column.count(-1)
    if not plus or not minus:
        return {"estimate": None, "hw": None, "low": None, "high": None, "df": None, "resolved": False}
    weights = [(1 / plus if s > 0 else -1 / minus) for s in column]
    estimate = sum(c * sum(xs) / len(xs) for c, xs in zip(weights, samples))
    hw = df = None
    if all(len(xs) >= 2 for xs in samples):
        terms = [c * c * _var(xs) / len(xs) for c, xs in zip(weights, samples)]
        var = sum(terms)
        if var == 0:
            hw, df = 0.0, float(sum(len(xs) - 1 for xs in samples))
        else:
            df = var ** 2 / sum(t * t / (len(xs) - 1) for t, xs in zip(terms, samples))
            hw = stats.t975(df) * math.sqrt(var)
    resolved = hw is not None and abs(estimate) > hw
    return {"estimate": estimate, "hw": hw, "low": None if hw is None else estimate - hw,
            "high": None if hw is None else estimate + hw, "df": df, "resolved": resolved}


def _var(xs: Sequence[float]) -> float:
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


# ---------------------------------------------------------------------- reporting


def effects_section(study: Evidence) -> list[str]:
    """report.md's "Effects" table (nothing when the study has no factorial effects)."""
    rows = study.effects
    if not rows:
        return []
    axis = rows[0].axis
    out = ["## Effects", "",
           f"Factorial effects on the area under the `{study.metric}` curve {AXIS_TEXT.get(axis, axis)} (seeds "
           f"pooled over iterations, {rows[0].arms} arms): a main effect is the mean of the arms at the factor's "
           "second level minus the mean at its first; an interaction A×B is the mean of the arms where A and B are "
           "both at the same level minus the mean of the others. 95% CIs are Welch–Satterthwaite intervals from the "
           "per-seed AUCs.", "", "| effect | estimate | 95% CI | resolved? |", "|---|---|---|---|"]
    for r in rows:
        label = (f"{r.name} ({r.levels[0][0]!r} → {r.levels[0][1]!r})" if r.kind == "main"
                 else f"{r.name} (interaction)")
        if r.aliases:
            label += f"; aliased with {', '.join(r.aliases)}"
        estimate = "n/a" if r.estimate is None else f"{r.estimate:+.3f}"
        ci = f"[{r.low:+.3f}, {r.high:+.3f}]" if r.hw is not None else "n/a (needs ≥ 2 seeds per arm)"
        verdict = ("yes: the CI excludes 0" if r.resolved else "no: the CI includes 0" if r.hw is not None
                   else "no interval")
        out.append(f"| {label} | {estimate} | {ci} | {verdict} |")
    return [*out, ""]


def mlflow_values(study: Evidence) -> dict[str, float]:
    """``analysis/effect/<name>`` (and ``analysis/effect_ci/<name>``, the CI half width) per effect;
    an interaction's name joins its factors with ``_x_``."""
    values: dict[str, float] = {}
    for r in study.effects:
        if r.estimate is not None:
            values[f"analysis/effect/{r.key}"] = float(r.estimate)
        if r.hw is not None:
            values[f"analysis/effect_ci/{r.key}"] = float(r.hw)
    return values


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
