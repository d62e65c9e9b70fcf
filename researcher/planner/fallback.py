"""The planner a study with an LLM uses: the LLM planner, with the offline planner taking any step it fails.

A small local model (Ollama, llama.cpp, a swarm server) is slow and writes bad JSON; a hosted one
times out now and then. Neither may stop a study or keep it past its deadline. Each step goes to the
LLM planner first, whose calls are bounded by the study's deadline and whose answers get one repair
round with their exact validation error. When it still has no valid answer, its endpoint failed past
its bounded retries, or the deadline leaves no time to ask, the offline planner takes that step
(framing, plan, client code, decision or report wording) and the study goes on; ``on_takeover`` hears
which step and why (the composition root writes it to LOG.md and the events, which the report lists).
The tokens the failed step spent stay counted in its reply's usage.

Two failures are not taken over: an exhausted quota (``QuotaExhausted``: the study parks and waits
for credit) and a step the offline planner cannot take either (a topic outside its catalog, a plan for
a knob it does not know): ``StepFailed`` then fails the study with both reasons, and the report follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from researcher.findings.records import JsonObject
from researcher.planner.llm import LLMPlanner
from researcher.planner.offline import OfflinePlanner
from researcher.planner.schema import (
    ClientCode,
    Decision,
    Planner,
    PlannerContext,
    PlannerError,
    QuotaExhausted,
    Reply,
    ReportText,
    TopicNotMappable,
)
from researcher.types.design import Framing, Plan
from researcher.types.failures import FailStudy
from researcher.types.usage import LLMCall, LLMUsage, add_usage, new_usage

__all__ = ["FallbackPlanner", "StepFailed", "Takeover"]
T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class Takeover:
    """The offline planner answered a step in the LLM planner's place."""

    step: str    # the planner step: frame_topic, plan_experiments, write_client, repair_client, decide, write_report
    reason: str  # why the LLM planner's answer was not used (its error)


class StepFailed(PlannerError, FailStudy):
    """Neither planner could take a step: the study fails with both reasons (and what the LLM spent)."""

    def failed_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().failed_state(state), "llm": add_usage(state.get("llm") or new_usage(), self.usage)}


class FallbackPlanner:
    name = "llm"  # the study is planned by the LLM (open world); the offline planner only stands in

    def __init__(self, llm: LLMPlanner, offline: OfflinePlanner,
                 on_takeover: Callable[[Takeover], None] | None = None) -> None:
        self.llm = llm
        self.offline = offline
        self.on_takeover = on_takeover or (lambda takeover: None)

    def add_listener(self, listener: Callable[[LLMCall], None]) -> None:
        """Report every LLM call record to ``listener`` too (``LLMPlanner.add_listener``)."""
        self.llm.add_listener(listener)

    # ------------------------------------------------------------------ steps

    def frame(self, topic: str, catalog: str) -> Reply[Framing]:
        return self._step("frame_topic", lambda planner: planner.frame(topic, catalog))

    def plan(self, framing: Framing, context: PlannerContext) -> Reply[Plan]:
        return self._step("plan_experiments", lambda planner: planner.plan(framing, context))

    def write_client(self, framing: Framing, example_source: str, experiments: list[JsonObject],
                     context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self._step("write_client",
                          lambda planner: planner.write_client(framing, example_source, experiments, context))

    def repair_client(self, code: str, error: str, example_source: str,
                      context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self._step("repair_client", lambda planner: planner.repair_client(code, error, example_source, context))

    def decide(self, framing: Framing, context: PlannerContext) -> Reply[Decision]:
        return self._step("decide", lambda planner: planner.decide(framing, context))

    def report(self, framing: Framing, context: PlannerContext) -> Reply[ReportText]:
        return self._step("write_report", lambda planner: planner.report(framing, context))

    # ------------------------------------------------------------------ the takeover

    def _step(self, step: str, ask: Callable[[Planner], Reply[T]]) -> Reply[T]:
        try:
            return ask(self.llm)
        except QuotaExhausted:
            raise  # waiting for credit is the study's call (it parks), not a reason to plan without the LLM
        except PlannerError as exc:
            failed = exc
        spent: LLMUsage = failed.usage
        why = " ".join(str(failed).split())  # one line: pydantic's validation errors span several
        try:
            reply = ask(self.offline)
        except TopicNotMappable as exc:
            raise StepFailed(f"The LLM planner failed {step} ({why}), and the offline planner cannot take it: {exc}",
                             spent) from exc
        self.on_takeover(Takeover(step, why))
        return Reply(reply.value, add_usage(spent, reply.usage))
