"""What every node needs besides the state: settings, the study's paths and its collaborators.

Built once by the composition root (``researcher.session.composition``, which a study's preparation calls) and bound to
the nodes by ``graph.py``; nodes never build their own planner, tracker or launcher. Building it
also wires the planner to the tracker: every LLM planner call becomes an MLflow trace on the
study's iteration run (``researcher.tracking.llm_traces``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from researcher.planner.deadline import LLMDeadline
from researcher.planner.schema import Planner
from researcher.runs.launcher import Launcher
from researcher.session.watchdogs import disk_low
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings


def _quiet(event: str, data: Mapping[str, object]) -> None:
    return None


@dataclass
class StudyContext:
    settings: ResearcherSettings
    layout: StudyLayout
    planner: Planner
    tracker: Tracker
    launcher: Launcher
    emit: Callable[[str, Mapping[str, object]], None] = field(default=_quiet)  # live progress for the terminal
    clock: Callable[[], float] = time.time
    window_end: float | None = None      # a scheduled session parks the study at this time
    min_free_disk_mb: float = 0.0        # park the study when the artifacts disk has less free space
    park_reason: str | None = None       # set by a watchdog (LLM quota, disk) to park at the next boundary
    # When the planner's LLM calls must end: the session sets it from the study's budget (the composition
    # root hands the same object to the LLM planner, which the graph may not reach otherwise).
    llm_deadline: LLMDeadline = field(default_factory=LLMDeadline)

    def __post_init__(self) -> None:
        # Only the LLM planner makes calls worth tracing; it reports each one to its listeners.
        add_listener = getattr(self.planner, "add_listener", None)
        if add_listener is not None:
            from researcher.study.store import read_state
            from researcher.tracking.llm_traces import PlannerTraces

            traces = PlannerTraces(self.tracker, self.layout.study_id, self.layout.llm_calls_dir,
                                   partial(read_state, self.layout))
            add_listener(traces.record)

    def stop_requested(self) -> bool:
        return self.layout.stop_file.exists()

    def park(self, reason: str) -> None:
        if not self.park_reason:
            self.say("watchdog", name="park", reason=reason)
        self.park_reason = self.park_reason or reason

    def should_park(self) -> str | None:
        """Why this session must park now (window over, a watchdog), or None to go on."""
        if self.park_reason:
            return self.park_reason
        if self.window_end is not None and self.clock() >= self.window_end:
            return "the session window ended"
        low = disk_low(self.layout.artifacts_root, self.min_free_disk_mb)
        if low:
            self.park(low)
        return self.park_reason

    def say(self, event: str, **data: Any) -> None:
        self.emit(event, data)
