"""The graph state: references and small numbers only (code, metrics and logs live on disk/MLflow).

LangGraph checkpoints the whole state after every node, so it must stay small. Every key is
overwritten by the node that returns it (no reducers): nodes return only what they change.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from researcher.planner.usage import LLMUsage

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


class StudyState(TypedDict, total=False):
    study_id: str
    topic: str
    phase: Phase
    options: dict[str, Any]          # StudyOptions as a dict
    budget: Budget
    iteration: int
    framing: dict[str, Any]          # planner.schema.Framing as a dict
    experiments: list[str]           # names of this iteration's experiments (files under studies/)
    validation: dict[str, Any]       # {attempts, ok, error}
    trials: list[Trial]              # this iteration's runs
    runs_launched: int               # over the whole study (budget: max_runs)
    run_seconds: list[float]         # measured wall time of finished runs (for planning the budget)
    iterations: list[dict[str, Any]]  # per-iteration summaries: best experiment, aucs, verdicts
    decision: dict[str, Any]         # {action: continue|conclude, reason}
    llm: LLMUsage
    mlflow_parent_run: str | None
    error: str | None
    stop_requested: bool
    parked: dict[str, Any] | None    # {phase, reason, at, runs}: where a parked study re-enters

