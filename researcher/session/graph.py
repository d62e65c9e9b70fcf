"""Wiring only: the study graph's nodes, edges and retry policies.

frame_topic → plan_experiments → write_client → validate ⇄ (repair) → launch_runs ⇄ monitor →
analyze → decide → (plan_experiments | write_report). A failed or stopped study goes straight to
write_report, which always runs last so every study ends with a report.

Parking: after any node before the report, a session whose window ended (or a watchdog: LLM quota,
disk) goes to ``park`` and ends; the next session re-enters at START, which routes by the phase the
study was parked in. A node that raises ``FailStudy`` (no retry can help) ends the study ``failed``;
one whose write the disk refused (``researcher.types.failures.is_disk_full``) parks it with a ``disk_full`` event, so
the next session, once space is freed, re-runs that node.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Protocol, cast

from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from researcher.session.context import StudyContext
from researcher.session.nodes import (
    analyze,
    decide,
    frame_topic,
    launch_runs,
    monitor,
    park,
    plan_experiments,
    validate,
    write_client,
    write_report,
)
from researcher.study.events import NODE_DOING
from researcher.study.state import StudyState, study_options
from researcher.types.failures import FailStudy, ParkStudy, is_disk_full, is_transient


def _transient(exc: Exception) -> bool:
    """Retry only what may succeed on a second try: LLM connection/429/5xx, a locked SQLite."""
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return True
    return is_transient(exc)


RETRY = RetryPolicy(max_attempts=3, initial_interval=2.0, retry_on=_transient)
# Where a session re-enters the graph, by the phase the study was in (a parked study keeps it).
ENTRY = {"framing": "frame_topic", "planning": "plan_experiments", "writing": "write_client",
         "validating": "validate", "running": "launch_runs", "analyzing": "analyze", "deciding": "decide",
         "reporting": "write_report", "failed": "write_report", "stopped": "write_report"}
NO_PARK = ("reporting", "done", "failed", "stopped")


class _BoundNode(Protocol):
    """A node as LangGraph calls it: by the keyword ``state`` too, which a plain ``Callable`` type
    does not promise (so it would match none of ``add_node``'s overloads)."""

    def __call__(self, state: StudyState) -> StudyState: ...


def _bind(name: str, node: Callable[[StudyState, StudyContext], StudyState], ctx: StudyContext) -> _BoundNode:
    def bound(state: StudyState) -> StudyState:
        ctx.say("node", action="enter", node=name, doing=NODE_DOING.get(name, name), phase=state.get("phase"))
        try:
            result = node(state, ctx)
        except ParkStudy as exc:
            # E.g. out of LLM credit: change nothing, park; the next window re-runs this node.
            ctx.park(str(exc))
            result = {}
        except FailStudy as exc:
            # E.g. the LLM failed a step the offline planner cannot take: the study fails, the report follows.
            ctx.say("node", action="fail", node=name, error=f"{type(exc).__name__}: {exc}"[:300])
            result = cast(StudyState, exc.failed_state(state))
        except Exception as exc:
            if not is_disk_full(exc):
                ctx.say("node", action="fail", node=name, error=f"{type(exc).__name__}: {exc}"[:300])
                raise
            # A full disk is a state, not a failure: park (the event log is best effort); the next
            # session re-runs this node once space is freed.
            ctx.say("disk_full", node=name, error=f"{type(exc).__name__}: {exc}"[:300])
            ctx.park(f"disk full: {name} could not write ({exc}); free some space and the next session resumes")
            result = {}
        ctx.say("node", action="leave", node=name, phase=result.get("phase", state.get("phase")))
        return result

    return bound


def build(ctx: StudyContext) -> StateGraph[StudyState]:
    g = StateGraph(StudyState)
    for name, node in (("frame_topic", frame_topic.frame), ("plan_experiments", plan_experiments.plan_iteration),
                       ("write_client", write_client.write), ("validate", validate.validate),
                       ("launch_runs", launch_runs.launch), ("monitor", monitor.poll_runs),
                       ("analyze", analyze.analyze), ("decide", decide.decide), ("park", park.park),
                       ("write_report", write_report.write)):
        g.add_node(name, _bind(name, node, ctx), retry_policy=RETRY)

    def parkable(route: Callable[[StudyState], str]) -> Callable[[StudyState], str]:
        def checked(state: StudyState) -> str:
            if state.get("phase") not in NO_PARK and not ctx.stop_requested() and ctx.should_park():
                return "park"
            return route(state)
        return checked

    def entry(state: StudyState) -> str:
        return ENTRY.get(state.get("phase") or "framing", "frame_topic")

    def ok_or_report(next_node: str, phase: str) -> Callable[[StudyState], str]:
        def route(state: StudyState) -> str:
            return next_node if state.get("phase") == phase and not ctx.stop_requested() else "write_report"
        return route

    def after_validate(state: StudyState) -> str:
        if ctx.stop_requested() or state.get("phase") == "failed":
            return "write_report"
        return "launch_runs" if state["validation"]["ok"] else "write_client"

    def routed_runs(after_monitor: bool) -> Callable[[StudyState], str]:
        def route(state: StudyState) -> str:
            statuses = [t["status"] for t in state["trials"]]
            running = statuses.count("running")
            # Fill a free slot first, so a finished run's core does not idle while others still train.
            # Runs queued for resources are retried after the monitor returns (a run ended, or a poll
            # passed with none running), never straight after launch_runs queued them.
            waiting = "pending" in statuses or "parked" in statuses or (after_monitor and "queued" in statuses)
            if waiting and running < study_options(state).parallel_runs and not ctx.stop_requested():
                return "launch_runs"
            if ctx.stop_requested() and "queued" in statuses and not running:
                return "launch_runs"  # it ends the queued runs
            return "monitor" if running or "queued" in statuses else "analyze"
        return route

    g.add_conditional_edges(START, entry, sorted(set(ENTRY.values())))
    g.add_conditional_edges("frame_topic", parkable(ok_or_report("plan_experiments", "planning")),
                            ["plan_experiments", "write_report", "park"])
    g.add_conditional_edges("plan_experiments", parkable(ok_or_report("write_client", "writing")),
                            ["write_client", "write_report", "park"])
    g.add_conditional_edges("write_client", parkable(lambda state: "validate"), ["validate", "park"])
    g.add_conditional_edges("validate", parkable(after_validate), ["launch_runs", "write_client", "write_report", "park"])
    g.add_conditional_edges("launch_runs", parkable(routed_runs(after_monitor=False)),
                            ["monitor", "launch_runs", "analyze", "park"])
    g.add_conditional_edges("monitor", parkable(routed_runs(after_monitor=True)),
                            ["monitor", "launch_runs", "analyze", "park"])
    g.add_conditional_edges("analyze", parkable(lambda state: "decide"), ["decide", "park"])
    g.add_conditional_edges("decide", parkable(ok_or_report("plan_experiments", "planning")),
                            ["plan_experiments", "write_report", "park"])
    g.add_edge("park", END)
    g.add_edge("write_report", END)
    return g
