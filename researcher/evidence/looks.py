"""The look at the data an analysis is: its place among the study's registered looks and its boundary.

plan.json registers the study's decision rule (``records.SequentialDesign``) and each iteration's look
(``records.LookPlan``) before any of its runs start. The pilot spends no alpha: it sizes the study from
the spread it measures (an internal pilot), and its seeds count again at every later look. The later
looks spend alpha by the registered spending function at their information fractions, so however many
of them a study takes, its chance of a false Yes or No stays at or below ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from researcher.evidence import sequential, stats
from researcher.findings.records import JsonObject, LookPlan, SequentialDesign


@dataclass(frozen=True)
class Look:
    number: int
    fraction: float | None  # None: the pilot
    boundary: sequential.Boundary | None  # None: the pilot, no decision (an infinitely wide interval)
    final_nominal: float  # the last look's two-sided nominal level, for sizing

    def half_width(self, estimate: stats.Estimate) -> float:
        """The look's interval half width for ``estimate``: its t quantile at this look's nominal level
        times its standard error (inf at the pilot or without a standard error)."""
        if self.boundary is None or not math.isfinite(estimate.se):
            return math.inf
        critical = sequential.critical_t(self.boundary, estimate.df)
        return critical * estimate.se if math.isfinite(critical) else math.inf

    def fields(self) -> JsonObject:
        """What a ``Comparison`` records of its look."""
        return {"look": self.number, "fraction": self.fraction,
                "boundary_z": self.boundary.z if self.boundary is not None else None}


def _kind(design: SequentialDesign) -> sequential.Spending:
    return cast(sequential.Spending, design.spending)


def final_nominal(design: SequentialDesign) -> float:
    """The nominal level of the last look when the looks after the pilot are equally spaced: what the
    seeds a study needs are computed at (0.05 for a single look)."""
    rest = max(design.looks - 1, 1)
    fractions = tuple((i + 1) / rest for i in range(rest))
    return sequential.boundaries(fractions, _kind(design), design.alpha)[-1].nominal


def current(design: SequentialDesign | None, looks: Sequence[LookPlan]) -> Look | None:
    """The last of ``looks`` (this analysis) with its boundary given the looks before it; None without a
    registered design (a plain 95% interval then)."""
    if design is None or not looks:
        return None
    last = looks[-1]
    boundary = None
    if last.fraction is not None:
        fractions = tuple(lk.fraction for lk in looks if lk.fraction is not None)
        boundary = sequential.boundaries(fractions, _kind(design), design.alpha)[-1]
    return Look(last.look, last.fraction, boundary, final_nominal(design))
