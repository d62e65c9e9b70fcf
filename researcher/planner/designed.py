"""A study whose design is given, not planned: the arms a discovery campaign's stage compares.

A discovery campaign (``researcher.campaign.discovery``) knows exactly which configurations each stage
compares: a screen around the incumbent at levels of its own choosing, the incumbent against a change
of several keys at once, the final incumbent against the defaults. A topic in words cannot say that, so
the campaign starts the study with ``researcher start --design JSON`` and a topic that reads the same
way (``topic_for``): the study's own checks (the framing and the plan against the topic's reading)
still hold it to what it says it tests.

``DesignedPlanner`` wraps the study's planner: it frames and plans from the design (the first iteration
runs its arms; a later look re-runs them on fresh seeds under new names, so the analysis pools them by
configuration), and leaves decisions, client code and the report to the planner it wraps.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from researcher.findings.axes import EVAL_METRIC, primary_axis
from researcher.findings.records import JsonObject
from researcher.planner import catalog
from researcher.planner.schema import ClientCode, Decision, Planner, PlannerContext, Reply, ReportText, free
from researcher.types.design import Experiment, Factor, Framing, Hypothesis, Plan


class DesignArm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,50}$")
    overrides: dict[str, Any]


class Design(BaseModel):
    """The arms a study runs (at most 8), on which task, and how they are read: ``comparison`` (arms[0] is
    the control), ``factorial`` (a screen: ``factors`` name the two levels of each varied key) or ``runs``
    (each arm scored on its own, nothing compared: a search baseline's single runs)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    shape: Literal["comparison", "factorial", "runs"] = "comparison"
    arms: list[DesignArm] = Field(min_length=1, max_length=8)
    factors: list[Factor] = Field(default_factory=list)
    why: str = ""  # the stage it is, in words (the plan's rationale)

    @model_validator(mode="after")
    def _consistent(self) -> Design:
        if len({a.name for a in self.arms}) != len(self.arms):
            raise ValueError("the design's arms need distinct names")
        if self.shape == "factorial" and len(self.factors) < 2:
            raise ValueError("a factorial design names at least two factors")
        if self.shape != "runs" and len(self.arms) < 2:
            raise ValueError(f"a {self.shape} design needs at least two arms")
        if self.shape == "comparison" and not self.varied():
            raise ValueError("the design's arms are identical: nothing is compared")
        return self

    def varied(self) -> list[str]:
        """The keys whose value differs between arms, those judged per episode first (group and batch
        size: then the study's verdict is read per episode consumed, which compares them fairly)."""
        keys = list(dict.fromkeys(k for a in self.arms for k in a.overrides))
        differ = [k for k in keys if len({repr(a.overrides.get(k)) for a in self.arms}) > 1]
        return sorted(differ, key=lambda k: primary_axis(k)[0] != "episode")

    @property
    def knob(self) -> str:
        if self.shape == "factorial":
            return self.factors[0].name
        if self.shape == "runs" and not self.varied():
            return sorted(self.arms[0].overrides, key=lambda k: primary_axis(k)[0] != "episode")[0]
        return self.varied()[0]


def topic_for(design: Design) -> str:
    """The topic a designed study is started with, read by ``topic.parse`` as what the design tests: the
    values of its first varied key on its task (a screen: an open question on its task)."""
    if design.shape == "factorial":
        return f"What makes the {design.task} task learn faster? (a screen around the incumbent configuration)"
    key = design.knob
    values = list(dict.fromkeys(catalog.show(a.overrides[key]) for a in design.arms))
    if len(values) == 1:
        return f"Does {key} = {values[0]} make the {design.task} task learn fast? (one configuration, scored alone)"
    named = ", ".join(f"{key} = {v}" for v in values[:-1]) + f" or {key} = {values[-1]}"
    return f"Which of {named} makes the {design.task} task learn faster?"


class DesignedPlanner:
    """``inner`` for everything but framing and planning, which follow ``design``."""

    def __init__(self, design: Design, inner: Planner) -> None:
        self.design = design
        self.inner = inner
        self.name = inner.name

    def frame(self, topic: str, catalog_text: str) -> Reply[Framing]:
        d = self.design
        factors = d.factors if d.shape == "factorial" else []
        return free(Framing(answerable=True, reason=d.why or "a campaign's designed stage", question=topic.strip(),
                            task=d.task, knob=d.knob, factors=factors))

    def plan(self, framing: Framing, context: PlannerContext) -> Reply[Plan]:
        """The design's arms; after the first look, the same arms on fresh seeds under new names."""
        iteration = int(context.get("iteration", 1))
        d = self.design
        hypothesis = Hypothesis(id=f"h{iteration}", metric=EVAL_METRIC, statement=(
            f"The arms of this {d.shape} ({', '.join(a.name for a in d.arms)}) differ in how fast the {d.task} task "
            f"learns: {d.why or 'a designed stage'}"), expected_effect="unknown: the campaign tests it on fresh seeds")
        experiments = [Experiment(name=_name(iteration, arm.name), hypothesis=hypothesis.id, overrides=arm.overrides)
                       for arm in d.arms]
        stage: Literal["initial", "replicate"] = "initial" if iteration <= 1 else "replicate"
        rationale = (d.why or "a designed stage") + ("" if stage == "initial" else
                                                      "; the same arms on fresh seeds for the next look")
        return free(Plan(hypotheses=[hypothesis], experiments=experiments, rationale=rationale,
                         shape="factorial" if d.shape == "factorial" else "comparison", stage=stage))

    def write_client(self, framing: Framing, example_source: str, experiments: list[JsonObject],
                     context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self.inner.write_client(framing, example_source, experiments, context)

    def repair_client(self, code: str, error: str, example_source: str,
                      context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self.inner.repair_client(code, error, example_source, context)

    def decide(self, framing: Framing, context: PlannerContext) -> Reply[Decision]:
        return self.inner.decide(framing, context)

    def report(self, framing: Framing, context: PlannerContext) -> Reply[ReportText]:
        return self.inner.report(framing, context)


def _name(iteration: int, arm: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", f"it{iteration}-{arm}")[:60]
