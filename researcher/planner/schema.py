"""What a planner answers at each step, as validated models (the LLM's structured-output schemas).

Both planners (offline and LLM) return these, so the nodes never see raw text. ``Reply`` pairs an
answer with the token usage it cost, which the nodes add to the budget in the graph state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from researcher.findings.records import JsonObject
from researcher.types.design import Framing, Plan
from researcher.types.failures import ParkStudy
from researcher.types.usage import LLMUsage, new_usage

T = TypeVar("T", bound=BaseModel)
# What a planner is shown for one call: the study so far as JSON, keyed by what the call needs (plan:
# iteration, history, tested_values, task_config, ...; decide: last; report: verdict, caveats). The LLM
# planner sends it as it is; the offline planner reads the keys it needs, each of the type its writer gives.
PlannerContext = dict[str, Any]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClientCode(_Answer):
    code: str = Field(description="the complete client.py source")
    notes: str = ""


class Decision(_Answer):
    action: Literal["continue", "conclude"]
    reason: str


class ProposedChange(_Answer):
    key: str = Field(description="a server config key")
    value: str | int | float | bool = Field(description="the level to try, as the key accepts it")
    why: str = Field(description="one sentence: why it should help the objective")


class ProposedChanges(_Answer):
    """A discovery campaign's hypotheses beyond the catalog for one round (``researcher.campaign.proposals``)."""

    hypotheses: list[ProposedChange] = Field(default_factory=list, max_length=5)


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
