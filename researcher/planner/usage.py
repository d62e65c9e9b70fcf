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


def new_usage() -> LLMUsage:
    return {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}


def add_usage(usage: LLMUsage, more: LLMUsage) -> LLMUsage:
    return {
        "calls": usage["calls"] + more["calls"],
        "prompt_tokens": usage["prompt_tokens"] + more["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"] + more["completion_tokens"],
        "cost_usd": round(usage["cost_usd"] + more["cost_usd"], 6),
    }
