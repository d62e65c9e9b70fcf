"""What planner calls cost: tokens and dollars per call, summed into the study's LLM budget.

The planner returns a usage with every answer; the graph state keeps the running total (the
``llm`` key), so this is the one type both sides share and it depends on nothing.
"""

from __future__ import annotations

from typing import TypedDict


class LLMUsage(TypedDict):
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class LLMCost(TypedDict):
    input_usd: float
    output_usd: float


class LLMCall(TypedDict):
    """One planner call as ``llm_calls/*.json`` holds it and the trace writer and listeners get it."""

    step: str                    # the planner step (``plan_experiments``; ``…:repair`` for a repair round)
    mode: str                    # structured | json
    model: str
    messages: list[dict[str, str]]  # the chat messages sent (role, content)
    answer: str | None
    error: str | None
    usage: LLMUsage
    cost: LLMCost
    seconds: float
    time: float


def new_usage() -> LLMUsage:
    return {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}


def add_usage(usage: LLMUsage, more: LLMUsage) -> LLMUsage:
    return {
        "calls": usage["calls"] + more["calls"],
        "prompt_tokens": usage["prompt_tokens"] + more["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"] + more["completion_tokens"],
        "cost_usd": round(usage["cost_usd"] + more["cost_usd"], 6),
    }
