"""The graph state: references and small numbers only (code, metrics and logs live on disk/MLflow).

LangGraph checkpoints the whole state after every node, so it must stay small. Every key is
overwritten by the node that returns it (no reducers): nodes return only what they change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict

from researcher.findings.records import IterationSummary
from researcher.runs.status import RunStatus, check
from researcher.types.design import Framing
from researcher.types.settings import StudyOptions
from researcher.types.usage import LLMUsage

if TYPE_CHECKING:
    from researcher.runs.record import RunRecord

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
    status: str              # a RunStatus value: its run record's once it has one (``sync_trial``)


class Validation(TypedDict):
    attempts: int
    ok: bool
    error: str | None


class DecisionRecord(TypedDict):
    action: Literal["continue", "conclude"]
    reason: str


class Parked(TypedDict, total=False):
    phase: Phase             # where the study re-enters
    reason: str
    at: float
    runs: list[str]


class StudyState(TypedDict, total=False):
    study_id: str
    topic: str
    phase: Phase
    options: dict[str, Any]          # StudyOptions as a dict (read with study_options())
    budget: Budget
    iteration: int
    framing: dict[str, Any]          # types.design.Framing as a dict (read with study_framing())
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


def study_options(state: StudyState) -> StudyOptions:
    """The study's options, typed (the state holds their JSON; keys a later version dropped are ignored)."""
    raw = state.get("options") or {}
    return StudyOptions.model_validate({k: v for k, v in raw.items() if k in StudyOptions.model_fields})


def study_framing(state: StudyState) -> Framing | None:
    """The study's framing, typed; None before the topic was framed (or when it could not be). The state
    holds its JSON; keys a later version dropped are ignored."""
    raw = state.get("framing")
    if not raw:
        return None
    return Framing.model_validate({k: v for k, v in raw.items() if k in Framing.model_fields})


def framed(state: StudyState) -> Framing:
    """The framing of a study past its framing node (every node after ``frame_topic``); a ``ValueError``
    for a state without one."""
    framing = study_framing(state)
    if framing is None:
        raise ValueError(f"study {state.get('study_id')!r} has no framing in phase {state.get('phase')!r}")
    return framing


def framing_metric(state: StudyState) -> str:
    """The metric the study judges: its framing's, or the default one before it is framed. Read on its own
    (the monitor polls with it on every tick), so a framing another version wrote in part still answers."""
    metric = (state.get("framing") or {}).get("metric")
    return str(metric) if metric else str(Framing.model_fields["metric"].default)


def summaries(state: StudyState) -> list[IterationSummary]:
    """The state's per-iteration summaries, read into models (the state holds their JSON; none: [])."""
    return IterationSummary.load_all(state.get("iterations") or [])


def last_summary(state: StudyState) -> IterationSummary | None:
    """The latest iteration's summary (None before the first analysis)."""
    history = summaries(state)
    return history[-1] if history else None


def sync_trial(trial: Trial, record: RunRecord | None) -> RunStatus:
    """The trial's status copied from its run record, the status' one owner (a trial without a record
    keeps its own). The state holds the plain value: a checkpoint never stores an enum."""
    if record is not None:
        trial["status"] = RunStatus(record.status).value
    return RunStatus(trial["status"])


def advance_trial(trial: Trial, to: RunStatus) -> RunStatus:
    """Move a trial that has no run record of its own (pending, queued, skipped, stopped before its
    launch) along the run-status table; refuses an illegal move like ``run_status.move``."""
    trial["status"] = check(trial["status"], to).value
    return to
