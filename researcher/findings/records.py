"""The researcher's typed records: what plan.json, analysis-<i>.json and the graph state hold.

Each file is read into these models once, where it is read (``study.files.read_plan``,
``IterationSummary.model_validate`` on the state's summaries), and the code inside passes models.
They keep the JSON they are read from byte-compatible:

- a key is written only when it was read or set (``dump`` is ``model_dump(exclude_unset=True)``), so
  an arm without a usable run still has no ``auc`` key and a summary written before a field existed
  (``study``, ``iteration_comparison``) stays without it — readers tell "absent" from ``null``;
- unknown keys of older files are kept (``extra="allow"``) and written back unchanged.

``JsonObject`` is for the shapes that really are open: a server config's overrides (any config key),
a client's factor levels, the topic's reading as the plan records it, the planner's per-step context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue

JsonObject = dict[str, JsonValue]
OK_STATUSES = ("finished", "cut")  # runs whose curve counts as evidence (cut = ended by the deadline)


def arm_key(overrides: Mapping[str, object]) -> str:
    """An arm's identity: its overrides, key order aside."""
    return json.dumps(overrides, sort_keys=True, default=str)


class Record(BaseModel):
    """A JSON record read from disk or state: lenient on input, written back key for key."""

    model_config = ConfigDict(extra="allow")

    def dump(self) -> dict[str, Any]:
        """The record as the JSON object it was read from (plus what was set since)."""
        return self.model_dump(exclude_unset=True)

    @classmethod
    def load_all(cls, items: list[Any]) -> list[Self]:
        return [cls.model_validate(item) for item in items]


# ---------------------------------------------------------------------- evidence (researcher.evidence.analysis)


class Cell(Record):
    """mean ± 95% CI half width (None: one seed, no interval) over ``n`` seeds."""

    mean: float
    hw: float | None = None
    n: int = 0


class Comparison(Record):
    """better − worse on one axis: the difference, its CI half width and what it resolves."""

    better: str
    worse: str
    better_value: Any = None
    worse_value: Any = None
    better_label: str = ""
    worse_label: str = ""
    axis: str = "step"
    diff: float
    hw: float | None = None
    clear: bool = False
    equivalent: bool = False
    seeds: int = 0
    seeds_needed: int | None = None
    # How the interval was read (``analysis.compare``): paired over shared seeds or Welch's; ``sd`` is the
    # spread of the per-seed differences (paired) or the arms' pooled sd (Welch), which sizes the study.
    paired: bool = False
    sd: float | None = None
    # The look at the data this is (``hw`` is the look's boundary-adjusted half width, ``hw95`` the plain
    # 95% one): its number, information fraction (None: the pilot, which spends no alpha) and boundary.
    look: int | None = None
    fraction: float | None = None
    boundary_z: float | None = None
    hw95: float | None = None


class Noise(Record):
    """The noise floor on one axis: pooled within-configuration sd of the AUC, from ``seeds`` in ``arms``."""

    sd: float | None = None
    seeds: int = 0
    arms: int = 0


class Effect(Record):
    """A factorial's main effect or two-factor interaction on the verdict axis (``researcher.evidence.factorial``)."""

    name: str
    key: str = ""
    kind: str = "main"  # main | interaction
    factors: list[str] = Field(default_factory=list)
    levels: list[list[Any]] = Field(default_factory=list)
    axis: str = "step"
    arms: int = 0
    aliases: list[str] = Field(default_factory=list)
    estimate: float | None = None
    hw: float | None = None
    low: float | None = None
    high: float | None = None
    df: float | None = None
    resolved: bool = False


class Arm(Record):
    """One configuration (same overrides = same arm) with its runs' scores; ``auc``, ``final`` and
    ``axes`` are set only when it has a usable run; ``runs`` (run dirs) are not stored."""

    name: str
    value: Any = None
    overrides: JsonObject = Field(default_factory=dict)
    statuses: list[str] = Field(default_factory=list)
    aucs: list[float] = Field(default_factory=list)
    finals: list[float] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)
    scores: dict[str, list[float]] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=list)  # each usable run's seed, in the order of ``aucs``/``scores``
    iterations: list[int] = Field(default_factory=list)
    auc: Cell | None = None
    final: Cell | None = None
    axes: dict[str, Cell] = Field(default_factory=dict)
    rounds: dict[str, int] = Field(default_factory=dict)  # per axis: fewest points of the metric in the window
    reach: dict[str, float] = Field(default_factory=dict)  # per axis: where its runs' curves end (mean)
    label: str = ""

    @property
    def scored(self) -> bool:
        return self.auc is not None


class Evidence(Record):
    """The pooled evidence of a set of trials (``analysis.evidence``): the study's ``study`` entry."""

    knob: str
    metric: str
    metric_note: str = ""
    axis: str = "step"
    axis_why: str = ""
    registered_metric: str = ""  # the metric and axis the hypotheses registered (the verdict's unless switched)
    registered_axis: str = ""
    switch: str = ""  # why the verdict's metric or axis is not the registered one ("" when it is)
    short: str = ""  # why no axis has enough points in every arm for a verdict ("" when one has)
    budgets: dict[str, float] = Field(default_factory=dict)
    measured: list[str] = Field(default_factory=lambda: ["step"])
    horizon: int = 0
    min_effect: float = 0.0
    noise_floor: dict[str, Noise] = Field(default_factory=dict)
    arms: list[Arm] = Field(default_factory=list)
    best: str | None = None
    best_value: Any = None
    comparison: Comparison | None = None
    axes_compared: dict[str, Comparison] = Field(default_factory=dict)
    sweep: bool = False
    effects: list[Effect] = Field(default_factory=list)
    plots: dict[str, str] = Field(default_factory=dict)


class IterationSummary(Record):
    """One iteration's table (``experiments``) and the whole study's evidence so far (``study``)."""

    iteration: int
    knob: str
    metric: str = "train/reward_mean"
    horizon: int = 0
    experiments: list[Arm] = Field(default_factory=list)
    best: str | None = None
    best_value: Any = None
    comparison: Comparison | None = None
    iteration_comparison: Comparison | None = None
    plateau: str | None = None
    study: Evidence | None = None  # absent in summaries written before pooled evidence (issue #16)
    plot: str | None = None

    @property
    def own_comparison(self) -> Comparison | None:
        """This iteration's comparison alone (summaries from before pooling hold it as ``comparison``)."""
        return self.iteration_comparison if "iteration_comparison" in self.model_fields_set else self.comparison

    def without_runs(self) -> IterationSummary:
        """As analyze stores it: numbers only (run dirs stay in run.json)."""
        data = self.dump()
        for row in [*data.get("experiments", []), *(data.get("study") or {}).get("arms", [])]:
            row.pop("runs", None)
        return IterationSummary.model_validate(data)


# ---------------------------------------------------------------------- plan.json


class PlannedHypothesis(Record):
    id: str = ""
    statement: str = ""
    metric: str = ""
    expected_effect: str = ""


class PlannedExperiment(Record):
    """An experiment as plan.json holds it (``researcher.types.design.Experiment.model_dump()``)."""

    name: str
    hypothesis: str = ""
    overrides: JsonObject = Field(default_factory=dict)
    factors: JsonObject = Field(default_factory=dict)
    # Its own budget where arms consume different episodes a step (``planner.arm_budgets``); absent: the
    # iteration's ``steps_per_run`` and the client's held-out cadence.
    steps: int | None = None
    episodes: int | None = None
    eval_every: int | None = None

    @property
    def settings(self) -> JsonObject:
        """What makes its arm: its server overrides and its client factor levels."""
        return {**self.overrides, **self.factors}


class LookPlan(Record):
    """One registered look at the data: the seeds per arm it has seen and its information fraction
    (None: the pilot, which sizes the study and spends no alpha; 1.0: the last look, which spends the rest)."""

    look: int
    seeds: int
    fraction: float | None = None


class SequentialDesign(Record):
    """The study's decision rule, written to plan.json before any run (``evidence.sizing``): how many looks,
    the alpha spending that keeps the false-positive rate at or below ``alpha`` over all of them, the pilot,
    and (once the pilot has run) the seeds per arm it was sized to and whether the budget reaches them."""

    # The promise is a false-positive rate at or below ``target``; the looks spend ``alpha``, a little less:
    # reading each look's z boundary as a t quantile at a few seeds leaks about 0.2 points (5.2% measured
    # when spending 5% over 5 looks of 3 seeds, 200,000 simulated null studies; 4.7% spending 4.5%).
    target: float = 0.05
    alpha: float = 0.045
    spending: str = "obrien-fleming"
    looks: int = 1
    pilot_seeds: int = 0
    max_seeds: int | None = None  # per arm, fixed from the pilot before the second look
    needed_seeds: int | None = None  # per arm, for 80% power to resolve ±min_effect at the pilot's spread
    needed_hours: float | None = None
    reachable: bool | None = None
    sizing: str = ""  # the sizing in words (LOG.md, the report)


class IterationPlan(Record):
    """One iteration's entry of plan.json: written before any of its runs started."""

    written: str = ""
    rationale: str = ""
    shape: str | None = None
    stage: str = ""
    assumptions: list[str] = Field(default_factory=list)
    code_change: str = ""
    question: JsonObject = Field(default_factory=dict)  # the topic's reading (planner.topic), open shape
    hypotheses: list[PlannedHypothesis] = Field(default_factory=list)
    experiments: list[PlannedExperiment] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    steps_per_run: int = 0
    look: LookPlan | None = None

    def experiment(self, name: str) -> PlannedExperiment | None:
        return next((e for e in self.experiments if e.name == name), None)


class PlanFile(Record):
    """plan.json: the framing and every iteration's plan, keyed by iteration number."""

    framing: JsonObject = Field(default_factory=dict)
    design: SequentialDesign | None = None
    iterations: dict[int, IterationPlan] = Field(default_factory=dict)

    def iteration(self, number: int) -> IterationPlan:
        return self.iterations.get(number) or IterationPlan()
