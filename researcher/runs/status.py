"""A training run's status, the moves it may make, and the one function that makes them.

The status lives in the run's record (run.json, ``runs.RunRecord.status``); a trial in the graph
state carries a copy for routing, refreshed from the record whenever one exists (``sync``). Only
the statuses of a run that never got a record — ``pending``, ``queued``, ``skipped``, ``stopped``
before its launch — are the trial's own. Like swarm's ``EpisodeState``: a table of the allowed
moves, and ``move`` refuses any other (``IllegalTransition``), so a finished run is never revived
by a late poll.

- ``pending``: planned, not started. ``queued``: waits for resources (the record stays ``pending``
  with ``queued_at`` set; the trial says ``queued``).
- ``running``: its server (and client) run. ``parked``: checkpointed and stopped by a window; resumes.
- Ends: ``finished`` (reached its target step), ``cut`` (ended by the deadline; its curve still
  counts), ``crashed``, ``stalled``, ``diverged``, ``stopped`` (a stop request or a spent budget),
  ``skipped`` (never launched: no time or run budget left; trials only).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, TypeVar

__all__ = ["ENDED", "LIVE", "TRANSITIONS", "IllegalTransition", "RunStatus", "can_move", "move"]


class RunStatus(StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    PARKED = "parked"
    FINISHED = "finished"
    CUT = "cut"
    CRASHED = "crashed"
    STALLED = "stalled"
    DIVERGED = "diverged"
    STOPPED = "stopped"
    SKIPPED = "skipped"


S = RunStatus
LIVE = frozenset({S.PENDING, S.QUEUED, S.RUNNING, S.PARKED})  # not ended (a record ``ended`` is not live)
ENDED = frozenset(set(RunStatus) - LIVE)
_NOT_STARTED_ENDS = frozenset({S.STOPPED, S.SKIPPED, S.CUT, S.CRASHED})
_RUN_ENDS = frozenset({S.FINISHED, S.CUT, S.CRASHED, S.STALLED, S.DIVERGED, S.STOPPED})

# Every allowed move; staying put is always allowed (a record is saved again with the same status).
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.PENDING: frozenset({S.QUEUED, S.RUNNING}) | _NOT_STARTED_ENDS,
    S.QUEUED: frozenset({S.PENDING, S.RUNNING, S.PARKED}) | _NOT_STARTED_ENDS,  # a parked run waits for a slot
    S.RUNNING: frozenset({S.PARKED}) | _RUN_ENDS,
    S.PARKED: frozenset({S.QUEUED, S.RUNNING}) | _RUN_ENDS,
    **{end: frozenset() for end in ENDED},
}


class IllegalTransition(ValueError):
    """A run was asked to move where its status does not allow (e.g. out of an end)."""


def can_move(current: RunStatus | str, to: RunStatus | str) -> bool:
    here, there = RunStatus(current), RunStatus(to)
    return here == there or there in TRANSITIONS[here]


def check(current: RunStatus | str, to: RunStatus | str) -> RunStatus:
    """``to`` as a status when ``current`` may move there, else ``IllegalTransition``."""
    if not can_move(current, to):
        allowed = ", ".join(sorted(TRANSITIONS[RunStatus(current)])) or "nothing (it has ended)"
        raise IllegalTransition(f"a {current} run cannot become {to}; from {current} it may become: {allowed}")
    return RunStatus(to)


class _Moved(Protocol):
    """What ``move`` moves: a run record (``runs.RunRecord``) or anything holding a status and its reason."""

    status: RunStatus
    reason: str


R = TypeVar("R", bound=_Moved)


def move(record: R, to: RunStatus | str, reason: str | None = None) -> R:
    """Move ``record`` to ``to`` (and set its ``reason`` when given); refuses an illegal move. The caller
    saves the record (``runs.save``) with whatever else the move changes."""
    record.status = check(record.status, to)
    if reason is not None:
        record.reason = reason
    return record
