"""The screen an open question gets ("What makes the letters task learn faster?"): two levels of each of
the catalog's knobs for the task, in a two-level fractional factorial of at most 8 arms.

A screen selects; it does not confirm. With more than four knobs its main effects are aliased with
two-factor interactions (resolution III), and the effect it flags largest is the one most likely
overestimated (the winner's curse). So its answer names what to confirm, and a campaign confirms each
flagged knob in a comparison of its own on fresh seeds (``researcher.campaign``): selection and
confirmation never share a seed.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from researcher.findings.axes import AXIS_TEXT, EVAL_METRIC, primary_axis
from researcher.findings.records import Effect
from researcher.planner import catalog
from researcher.planner.schema import Decision
from researcher.types.design import Experiment, Factor, Framing, Hypothesis, Plan

__all__ = ["arms", "confirmations", "decide", "flagged", "framing", "is_screen", "knobs", "plan"]

MAX_ARMS = 8
# Columns of the factors past the third are products of the first three (D=AB, E=AC, F=BC, G=ABC): the
# standard 2^(7-4) resolution III generators, so up to 7 knobs fit in 8 arms.
_GENERATORS = ((0, 1), (0, 2), (1, 2), (0, 1, 2))
MAX_KNOBS = 3 + len(_GENERATORS)
# Engines are set for a run's life and need other installs; group and batch sizes change the episodes a
# step consumes, so no single axis compares them with the rest (they get a comparison of their own).
# A random reward is a control (does the model learn from the reward at all?), not a setting to choose.
_LEFT_OUT = {"engine", "trainer", "group_size", "batch_groups", "random_reward"}


def knobs(task: str) -> list[catalog.Knob]:
    """The knobs a screen of ``task`` varies: the catalog's reward-judged knobs that apply to the task,
    in catalog order, at most ``MAX_KNOBS``."""
    usable = [k for k in catalog.KNOBS if k.metric == catalog.REWARD_METRIC and k.task in (None, task)
              and k.key not in _LEFT_OUT and primary_axis(k.key)[0] == "step"]
    return usable[:MAX_KNOBS]


def levels(knob: catalog.Knob) -> list[Any]:
    """Its two levels: the reference ("off") and the value "with X" means, else the standard pair."""
    return [knob.reference, knob.on] if knob.reference is not None else list(knob.first[:2])


def is_screen(framing: Framing) -> bool:
    """A framing of several server knobs at two levels each (the offline planner frames only screens so)."""
    return len(framing.factors) >= 2 and all(f.where == "server" and len(f.levels) == 2 for f in framing.factors)


def arms(factors: list[Factor]) -> list[dict[str, Any]]:
    """The design's arms as server overrides: every combination for up to three factors, else the 8-arm
    fraction of the generators above."""
    k = len(factors)
    if not 2 <= k <= MAX_KNOBS:
        raise ValueError(f"a screen varies 2 to {MAX_KNOBS} knobs, not {k}")
    base = list(itertools.product((-1, 1), repeat=min(k, 3)))
    signs = [row + tuple(math.prod(row[i] for i in gen) for gen in _GENERATORS[:max(k - 3, 0)]) for row in base]
    return [{f.name: f.levels[(s + 1) // 2] for f, s in zip(factors, row, strict=True)} for row in signs]


def framing(task: str) -> Framing:
    """The open question framed as a screen of the task's knobs."""
    chosen = knobs(task)
    factors = [Factor(name=k.key, where="server", levels=levels(k)) for k in chosen]
    size = len(arms(factors))
    names = ", ".join(f"{k.key} ({catalog.show(levels(k)[0])} or {catalog.show(levels(k)[1])})" for k in chosen)
    text = (f"Which of {names} make the {task} task learn faster, measured as the area under the held-out reward "
            f"curve {AXIS_TEXT['step']}? A screen: two levels of each knob in a two-level "
            f"{'fractional ' if size < 2 ** len(chosen) else ''}factorial of {size} arms; what it flags is confirmed "
            "on fresh seeds.")
    return Framing(answerable=True, question=text, task=task, knob=chosen[0].key, factors=factors,
                   reason=f"an open question names no knob: a screen of the {task} task's {len(chosen)} catalog knobs")


def plan(framing: Framing, iteration: int) -> Plan:
    """The screen's arms, named by their row of the design."""
    hypothesis = Hypothesis(id=f"h{iteration}", metric=EVAL_METRIC, statement=(
        f"At least one of {', '.join(f.name for f in framing.factors)} changes how fast the {framing.task} task "
        "learns; each main effect is the mean of the arms at the knob's second level minus the mean at its first"),
        expected_effect="unknown: a screen registers no direction; it flags main effects whose 95% interval excludes 0 "
                        "and whose estimate is beyond the minimum effect of interest")
    experiments = [Experiment(name=f"it{iteration}-arm{i + 1}", hypothesis=hypothesis.id, overrides=overrides)
                   for i, overrides in enumerate(arms(framing.factors))]
    size = len(experiments)
    return Plan(hypotheses=[hypothesis], experiments=experiments, shape="factorial", stage="initial",
                rationale=(f"a {size}-arm two-level design over {len(framing.factors)} knobs: every arm informs every "
                           "main effect, so the screen costs one comparison's seeds per arm, not one per knob"),
                assumptions=[f"main effects are aliased with two-factor interactions in {size} arms"]
                if size < 2 ** len(framing.factors) else [])


def flagged(effects: list[Effect], min_effect: float) -> list[Effect]:
    """The main effects a screen flags for confirmation, largest first: a 95% interval that excludes 0 and
    an estimate beyond ±``min_effect`` (as the verdict rules: a resolved difference below the minimum of
    interest is no finding to confirm)."""
    mains = [e for e in effects if e.kind == "main" and e.resolved and e.estimate is not None
             and abs(e.estimate) > min_effect]
    return sorted(mains, key=lambda e: -abs(e.estimate or 0.0))


def decide(framing: Framing, effects: list[Effect], min_effect: float) -> Decision:
    """A screen ends after its one look: more seeds of it would only sharpen a selection, which the
    confirmations on fresh seeds do without the winner's curse."""
    found = flagged(effects, min_effect)
    if not found:
        return Decision(action="conclude", reason=f"the screen flags no knob: no main effect's 95% interval excludes 0 "
                                                  f"with an estimate beyond ±{min_effect}")
    listed = ", ".join(f"{e.name} ({e.estimate or 0.0:+.3f} ± {e.hw or 0.0:.3f})" for e in found)
    return Decision(action="conclude", reason=f"the screen flags {listed}: each is confirmed on fresh seeds, not here")


def confirmations(framing: Framing, effects: list[Effect], min_effect: float) -> list[tuple[str, str]]:
    """Each flagged knob as a comparison to confirm: its topic and the direction the screen saw."""
    out = []
    by_name = {f.name: f for f in framing.factors}
    for effect in flagged(effects, min_effect):
        factor = by_name.get(effect.name)
        if factor is None:
            continue
        low, high = (catalog.show(v) for v in factor.levels)
        out.append((f"Does {factor.name} = {high} make the {framing.task} task learn faster than {factor.name} = "
                    f"{low}?", "yes" if (effect.estimate or 0.0) > 0 else "no"))
    return out
