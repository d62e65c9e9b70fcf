"""Budget arithmetic over the state: time left before the report reserve, runs and LLM use left.

Kept in one place so the nodes (launch, monitor, decide) agree on what "out of budget" means.
"""

from __future__ import annotations

import statistics

from researcher.study.state import Budget, StudyState

DEFAULT_RUN_S = 90.0     # assumed wall time of a run before one has been measured


def make_budget(now: float, deadline: float, *, max_runs: int, max_iterations: int, max_repairs: int,
                max_llm_tokens: int, max_llm_cost_usd: float) -> Budget:
    total = max(deadline - now, 0.0)
    # Keep ~5% (15-60 s) for analysis and the report.
    reserve = min(max(total * 0.05, 15.0), 60.0)
    return {"deadline": deadline, "max_runs": max_runs, "max_iterations": max_iterations, "max_repairs": max_repairs,
            "max_llm_tokens": max_llm_tokens, "max_llm_cost_usd": max_llm_cost_usd, "report_reserve_s": reserve}


def time_left(state: StudyState, now: float) -> float:
    """Seconds until the work must stop (the deadline minus the report reserve)."""
    budget = state["budget"]
    return budget["deadline"] - budget["report_reserve_s"] - now


def runs_left(state: StudyState) -> int:
    return state["budget"]["max_runs"] - state.get("runs_launched", 0)


def llm_exhausted(state: StudyState) -> str | None:
    usage, budget = state.get("llm"), state["budget"]
    if not usage:
        return None
    if usage["prompt_tokens"] + usage["completion_tokens"] >= budget["max_llm_tokens"]:
        return f"LLM token budget spent ({budget['max_llm_tokens']} tokens)"
    if budget["max_llm_cost_usd"] and usage["cost_usd"] >= budget["max_llm_cost_usd"]:
        return f"LLM cost budget spent (${budget['max_llm_cost_usd']:.2f})"
    return None


def run_estimate_s(state: StudyState) -> float:
    measured = state.get("run_seconds") or []
    return statistics.median(measured) if measured else DEFAULT_RUN_S

