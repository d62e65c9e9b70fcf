"""A study's size: the looks registered before any run, the seeds the pilot says a decision needs, and
how many seeds each later look runs within the budget.

Registered first (plan.json, before the pilot runs): at most ``max_iterations`` looks, O'Brien–Fleming
alpha spending at 5%, the pilot's seeds. After the pilot the spread of its paired difference and its
measured seconds per run give the seeds per arm that resolve ±``min_effect`` with 80% power, and the
seeds the budget can run; the study is sized to what the budget runs (it stops early once settled), and
when that is short of the need it says so at once ("needs about N seeds an arm, about H hours more here").
Each later look is registered before its runs start, with its information fraction; the last look the
budget allows spends what alpha is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from researcher.evidence import stats
from researcher.evidence.looks import final_nominal
from researcher.findings.records import Comparison, LookPlan, SequentialDesign
from researcher.study import budget
from researcher.study.state import StudyState, study_options

SPENDING = "obrien-fleming"  # strict early, close to a fixed design's 1.96 at the last look
VALIDATE_S = 30.0  # a look's smoke run before its runs start


@dataclass(frozen=True)
class Room:
    """What the budget holds when a look is planned: time, measured seconds per run, runs, parallelism."""

    time_left_s: float
    run_s: float
    parallel: int
    runs_left: int
    arms: int

    def seeds_per_look(self, looks: int) -> int:
        """Seeds per arm each of ``looks`` more looks can run, sharing the time and runs left evenly."""
        if looks < 1 or self.arms < 1:
            return 0
        waves = int(max(self.time_left_s / looks - VALIDATE_S, 0.0) // max(self.run_s, 1e-9))
        return max(0, min(waves * self.parallel // self.arms, self.runs_left // (self.arms * looks)))

    def hours_for(self, seeds: int) -> float:
        """Hours ``seeds`` more seeds per arm take here, in one look."""
        return (VALIDATE_S + math.ceil(seeds * self.arms / max(self.parallel, 1)) * self.run_s) / 3600


def room_now(state: StudyState, now: float, arms: int = 2) -> Room:
    """What the study's budget holds for a look now: the time before the report reserve, the measured
    seconds a run takes, its parallel runs and the runs left."""
    return Room(budget.time_left(state, now), budget.run_estimate_s(state), study_options(state).parallel_runs,
                budget.runs_left(state), arms)


def register(looks: int, pilot_seeds: int, target: float = 0.05) -> SequentialDesign:
    """The decision rule written before the pilot runs, for a false-positive rate of at most ``target``. A
    single look is one exact t test: it spends the whole target; several looks spend a little less (the
    same 0.9 of it as ``SequentialDesign.alpha`` spends of 0.05)."""
    default = SequentialDesign()
    design = SequentialDesign(spending=SPENDING, looks=looks, pilot_seeds=pilot_seeds, target=target,
                              alpha=target * default.alpha / default.target)
    return design.model_copy(update={"alpha": design.target}) if looks == 1 else design


def pilot_look(design: SequentialDesign) -> LookPlan:
    """The first look: the pilot, which spends no alpha unless it is the only look."""
    return LookPlan(look=1, seeds=design.pilot_seeds, fraction=1.0 if design.looks == 1 else None)


def size(design: SequentialDesign, pilot: Comparison | None, room: Room, min_effect: float) -> SequentialDesign:
    """``design`` sized from the pilot's comparison: the seeds per arm the budget runs over the looks left
    (``max_seeds``), the seeds a decision needs at the pilot's spread and whether the budget reaches them."""
    looks = design.looks - 1
    while looks > 1 and room.seeds_per_look(looks) < 1:
        looks -= 1  # fewer, larger looks when the budget cannot give each a seed
    fits = design.pilot_seeds + looks * room.seeds_per_look(looks)
    needed = None
    if pilot is not None and pilot.sd is not None:
        needed = stats.seeds_needed(pilot.diff, pilot.sd, min_effect, paired=pilot.paired,
                                    nominal=final_nominal(design))
    amended = design.model_copy(update={"max_seeds": fits, "needed_seeds": needed,
                                        "reachable": needed is not None and needed <= fits})
    amended.needed_hours = room.hours_for(max(needed - design.pilot_seeds, 0)) if needed is not None else None
    amended.sizing = _words(amended, pilot, min_effect)
    return amended


def _words(design: SequentialDesign, pilot: Comparison | None, min_effect: float) -> str:
    spread = (f"the pilot's spread ({'paired difference' if pilot.paired else 'per-arm'} sd {pilot.sd:.4f})"
              if pilot is not None and pilot.sd is not None else "")
    if design.needed_seeds is None:
        need = (f"{spread} cannot size it (more than 10,000 seeds an arm)" if spread else
                "the pilot gave no spread to size it from")
        return f"Sized from the pilot: {need}; the budget runs {design.max_seeds} seeds an arm."
    hours = ""
    if design.needed_seeds <= design.pilot_seeds:
        hours = ", no more than the pilot ran"
    elif design.needed_hours is not None:
        more = (f"{design.needed_hours:.1f} hours" if design.needed_hours >= 1 else
                f"{max(design.needed_hours * 60, 1):.0f} minutes")
        hours = f", about {more} more here"
    need = (f"{spread} needs about {design.needed_seeds} seeds an arm to resolve ±{min_effect} at 80% power"
            f"{hours}")
    if design.reachable:
        return f"Sized from the pilot: {need}; the budget runs up to {design.max_seeds}, stopping once settled."
    return (f"The budget cannot decide this: {need}, and the budget runs only {design.max_seeds}. "
            "The study runs what fits.")


def next_look(design: SequentialDesign, previous: LookPlan, room: Room) -> LookPlan | None:
    """The next look's plan: its cumulative seeds per arm and information fraction (1.0 for the last the
    budget or the registered count allows); None when the budget runs no further seed."""
    number = previous.look + 1
    if number > design.looks or design.max_seeds is None:
        return None
    left = design.looks - number + 1
    planned = math.ceil(max(design.max_seeds - previous.seeds, 0) / left)
    batch = min(planned, room.seeds_per_look(1))
    if batch < 1:
        return None
    seeds = previous.seeds + batch
    after = Room(room.time_left_s - room.hours_for(batch) * 3600, room.run_s, room.parallel,
                 room.runs_left - batch * room.arms, room.arms)
    last = number == design.looks or seeds >= design.max_seeds or after.seeds_per_look(1) < 1
    return LookPlan(look=number, seeds=seeds, fraction=1.0 if last else seeds / design.max_seeds)
