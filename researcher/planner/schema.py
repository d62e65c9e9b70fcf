"""What a planner answers at each step, as validated models (the LLM's structured-output schemas).

Both planners (offline and LLM) return these, so the nodes never see raw text. ``Reply`` pairs an
answer with the token usage it cost, which the nodes add to the budget in the graph state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from researcher.findings.records import JsonObject
from researcher.planner.usage import LLMUsage, new_usage
from researcher.watchdogs import ParkStudy

T = TypeVar("T", bound=BaseModel)
# What a planner is shown for one call: the study so far as JSON, keyed by what the call needs (plan:
# iteration, history, tested_values, task_config, ...; decide: last; report: verdict, caveats). The LLM
# planner sends it as it is; the offline planner reads the keys it needs, each of the type its writer gives.
PlannerContext = dict[str, Any]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Factor(_Answer):
    """One varied thing of a design: a server config key, or a client-side factor the client reads
    from its ``FACTORS`` dict (prompt format, a tool on or off, a reward variant)."""

    name: str = Field(description="a server config key (where=server) or the client's FACTORS key (where=client)",
                      pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    where: Literal["server", "client"]
    levels: list[Any] = Field(min_length=2, description="the values compared; the first is the low/standard one")


class Framing(_Answer):
    answerable: bool = Field(description="false when the topic maps onto nothing we can run")
    reason: str = Field(description="why (for unanswerable topics: what is missing)")
    question: str = Field(description="the topic restated as one testable question")
    task: str = Field(description="example study name (e.g. letters), or with `base` set a new task's name")
    knob: str = Field(description="the varied key of a one-factor design (a server config key or a client factor), "
                                  "the first factor of a factorial")
    metric: str = Field("train/reward_mean", description="slash-named training metric judged")
    base: str = Field("", description="example study whose config.toml and client the study starts from; "
                                      "\"\" = `task` is that example")
    factors: list[Factor] = Field(default_factory=list, description="the design's factors (several for a factorial); "
                                                                    "empty = the one server knob `knob`")

    @property
    def example(self) -> str:
        """The example study the config and starting client come from."""
        return self.base or self.task

    def client_factors(self) -> dict[str, Factor]:
        return {f.name: f for f in self.factors if f.where == "client"}


class Hypothesis(_Answer):
    id: str
    statement: str
    metric: str
    expected_effect: str = Field(description="direction and rough size, written before any run")


class Experiment(_Answer):
    name: str = Field(description="short unique name: lowercase letters, digits, '-' or '_'",
                      pattern=r"^[a-z0-9][a-z0-9_-]{0,59}$")
    hypothesis: str = Field(description="id of the hypothesis it tests")
    overrides: dict[str, Any] = Field(description="server config keys set on top of the task's config.toml")
    factors: dict[str, Any] = Field(default_factory=dict, description="client-side factor levels: the FACTORS "
                                                                      "entries this experiment's client.py sets")


class Plan(_Answer):
    hypotheses: list[Hypothesis] = Field(min_length=1)
    experiments: list[Experiment] = Field(min_length=1, max_length=8)
    rationale: str
    shape: Literal["comparison", "sweep", "factorial"] = Field(
        "comparison", description="comparison: the named arms ('A vs B', 'does X help'); sweep: a dose-response "
        "curve over >= 4 values of the knob ('how does X affect Y', 'what is the best X'); factorial: every "
        "(or a fraction of every) combination of two levels of several factors (main effects and interactions)")
    stage: Literal["initial", "replicate", "refine"] = Field(
        "initial", description="initial: the question's first design; replicate: the same arms on fresh seeds "
        "because their difference was unresolved; refine: new values around the best of a resolved result")
    assumptions: list[str] = Field(default_factory=list,
                                   description="what the plan assumed where the topic was not explicit, and why")
    code_change: str = Field("", description="what the client code changes this iteration, and why (\"\" = the "
                                             "previous iteration's client as is)")


class ClientCode(_Answer):
    code: str = Field(description="the complete client.py source")
    notes: str = ""


class Decision(_Answer):
    action: Literal["continue", "conclude"]
    reason: str


class ReportText(_Answer):
    answer: str = Field(description="the answer to the question in 1-3 sentences, citing the numbers")
    discussion: str = Field(description="caveats, negative results and what to try next")


@dataclass
class Reply(Generic[T]):
    value: T
    usage: LLMUsage


def free(value: T) -> Reply[T]:
    return Reply(value, new_usage())


class Planner(Protocol):
    """One method per planner step; every method gets plain data and returns a validated answer."""

    name: str

    def frame(self, topic: str, catalog: str) -> Reply[Framing]: ...

    def plan(self, framing: Framing, context: PlannerContext) -> Reply[Plan]: ...

    def write_client(self, framing: Framing, example_source: str, experiments: list[JsonObject],
                     context: PlannerContext | None = None) -> Reply[ClientCode]: ...

    def repair_client(self, code: str, error: str, example_source: str,
                      context: PlannerContext | None = None) -> Reply[ClientCode]: ...

    def decide(self, framing: Framing, context: PlannerContext) -> Reply[Decision]: ...

    def report(self, framing: Framing, context: PlannerContext) -> Reply[ReportText]: ...


class TopicNotMappable(ValueError):
    """The topic names nothing the researcher can run; the message lists what it can study."""


class PlannerError(RuntimeError):
    """The planner produced no valid answer (after its repair round), its endpoint refused or failed, or the
    study's deadline left no time to ask. ``usage`` is what the step's answered calls cost before it
    failed: the tokens are spent whatever happens next, so the study's LLM budget still counts them."""

    def __init__(self, message: str, usage: LLMUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage or new_usage()


class OutOfTime(PlannerError):
    """The study's deadline leaves no time for (another) LLM call of this step."""


class QuotaExhausted(PlannerError, ParkStudy):
    """The LLM provider refused for lack of quota or credit: park the study until the next window."""
