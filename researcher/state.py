"""The graph state: references and small numbers only (code, metrics and logs live on disk/MLflow).

LangGraph checkpoints the whole state after every node, so it must stay small. Every key is
overwritten by the node that returns it (no reducers): nodes return only what they change.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from researcher.planner.usage import LLMUsage
from researcher.records import IterationSummary

Phase = Literal["framing", "planning", "writing", "validating", "running", "analyzing", "deciding",
                "reporting", "done", "failed", "stopped", "parked"]


class Budget(TypedDict):
    deadline: float          # absolute epoch seconds
    max_runs: int
    max_iterations: int
    max_repairs: int
    max_llm_tokens: int
    max_llm_cost_usd: float
    report_reserve_s: float  # time kept free at the end for analysis and the report


class Trial(TypedDict):
    trial: int
    key: str                 # study/iteration/trial
    experiment: str
    seed: int
    run_dir: str
    status: str              # pending | queued (waits for resources) | running | parked | finished | crashed | …


class Validation(TypedDict):
    attempts: int
    ok: bool
    error: str | None


class DecisionRecord(TypedDict):
    action: Literal["continue", "conclude"]
    reason: str


class Parked(TypedDict, total=False):
    phase: str               # where the study re-enters
    reason: str
    at: float
    runs: list[str]


class StudyState(TypedDict, total=False):
    study_id: str
    topic: str
    phase: Phase
    options: dict[str, Any]          # StudyOptions as a dict
    budget: Budget
    iteration: int
    framing: dict[str, Any]          # planner.schema.Framing as a dict
    experiments: list[str]           # names of this iteration's experiments (files under studies/)
    validation: Validation
    trials: list[Trial]              # this iteration's runs
    runs_launched: int               # over the whole study (budget: max_runs)
    run_seconds: list[float]         # measured wall time of finished runs (for planning the budget)
    iterations: list[dict[str, Any]]  # records.IterationSummary.dump() each (read with summaries())
    decision: DecisionRecord
    llm: LLMUsage
    mlflow_parent_run: str | None
    error: str | None
    stop_requested: bool
    parked: Parked | None            # where a parked study re-enters



def summaries(state: StudyState) -> list[IterationSummary]:
    """The state's per-iteration summaries, read into models (the state holds their JSON)."""
    return IterationSummary.load_all(state.get("iterations") or [])

