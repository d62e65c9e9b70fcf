"""``researcher watch [STUDY]``: a live terminal view of a study, built from its event log only.

The view is a fold of the study's events (``researcher.study.events``): ``WatchState.apply`` takes one event
at a time, ``render`` draws the state with rich — the current node and what it is doing, the
planner's last decisions and their reasons, the live runs with step, reward and a sparkline of the
reward, and the recent events (launches, repairs, watchdogs, parks). It reads files only, so it
works for a study another process runs and carries on across a researcher restart (the new process
appends to the same log, with ids that keep increasing).

Into a pipe or a file (not a terminal) it prints one plain line per event as the events come, so
another program can read them; ``--once`` prints the current view and exits.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from researcher.operations import overview
from researcher.operations.terminal import distinct
from researcher.study.events import Event, Follower, events_path
from researcher.study.layout import StudyLayout
from researcher.study.store import is_locked

__all__ = ["WatchState", "format_line", "pick_study", "render", "sparkline", "watch"]

_BARS = "▁▂▃▄▅▆▇█"
_DECISIONS = ("framed", "planned", "decided", "llm_call", "takeover", "validated", "client")
_NOTABLE = ("session", "launched", "ended", "client_restart", "unparked", "watchdog", "parked", "report")
_LIVE = ("running", "starting")
_CURVE = 200       # reward points kept per run (the sparkline shows the last few dozen)
_ENDED_SHOWN = 6   # ended runs kept in the table beside the live ones


def sparkline(values: list[float], width: int = 24) -> str:
    """The last ``width`` values as block characters scaled between their min and max."""
    shown = [v for v in values if v is not None][-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    span = high - low
    return "".join(_BARS[int((v - low) / span * (len(_BARS) - 1)) if span > 0 else 3] for v in shown)


def step_curves(runs: list[RunView], width: int) -> dict[str, str]:
    """Each run's rewards on one shared step axis: ``width`` slots ending at the furthest step any run
    reached, a slot blank where a run has no point, every curve scaled between the runs' common min and
    max, so two arms' curves can be read against each other."""
    last = max((step for run in runs for step, _ in run.points), default=0)
    span = max(1, -(-last // width))  # steps per slot
    first = max(0, last - span * width)
    values = [v for run in runs for step, v in run.points if step > first]
    if not values:
        return {run.key: "" for run in runs}
    low, high = min(values), max(values)
    curves = {}
    for run in runs:
        slots: dict[int, float] = {}
        for step, value in run.points:
            if step > first:
                slots[min(width - 1, (step - first - 1) // span)] = value
        curves[run.key] = "".join(
            " " if k not in slots else _BARS[int((slots[k] - low) / (high - low) * (len(_BARS) - 1)) if high > low else 3]
            for k in range(width)).rstrip()
    return curves


@dataclass
class RunView:
    key: str
    experiment: str = ""
    seed: Any = ""
    status: str = "starting"
    step: int = 0
    target: int | None = None
    reward: float | None = None
    rewards: list[float] = field(default_factory=list)
    points: list[tuple[int, float]] = field(default_factory=list)  # (step, reward), for the shared axis
    since: float = 0.0


@dataclass
class WatchState:
    """What the view shows, folded from the events seen so far."""

    study_id: str
    last_id: int = 0
    last_ts: float | None = None
    node: str | None = None
    doing: str | None = None
    node_running: bool = False  # entered and not yet left: its time so far is worth showing
    node_since: float | None = None
    phase: str | None = None
    runs: dict[str, RunView] = field(default_factory=dict)
    decisions: deque[Event] = field(default_factory=lambda: deque(maxlen=6))
    recent: deque[Event] = field(default_factory=lambda: deque(maxlen=10))

    def apply(self, event: Event) -> None:
        self.last_id, self.last_ts = event["id"], event.get("ts")
        kind = event.get("kind")
        if kind == "node":
            self.phase = event.get("phase") or self.phase
            if event.get("action") == "enter":
                self.node, self.doing, self.node_since = event.get("node"), event.get("doing"), event.get("ts")
                self.node_running = True
            elif event.get("action") == "fail":
                self.doing, self.node_since = f"failed: {event.get('error')}", event.get("ts")
                self.node_running = False
            elif event.get("node") == self.node:
                self.doing, self.node_since = f"done (phase now {self.phase})", event.get("ts")
                self.node_running = False
        elif kind == "session":
            self.node, self.node_since = None, event.get("ts")
            self.doing = f"session {event.get('action')} (pid {event.get('pid')})"
            self.node_running = False
        repair = (kind == "client" and event.get("repaired")) or (kind == "validated" and not event.get("ok"))
        if kind in _DECISIONS:
            self.decisions.append(event)
        if kind in _NOTABLE or repair:
            self.recent.append(event)
        if kind == "parked":  # the session checkpointed and stopped every live run
            for run in self.runs.values():
                if run.status in _LIVE:
                    run.status = "parked"
        self._apply_run(kind, event)

    def _apply_run(self, kind: str | None, event: Event) -> None:
        key = event.get("key")
        if not key or kind not in ("launched", "progress", "ended", "client_restart", "unparked", "watchdog"):
            return
        run = self.runs.setdefault(key, RunView(key=key, since=event.get("ts") or 0.0))
        run.experiment = event.get("experiment", run.experiment)
        run.seed = event.get("seed", run.seed)
        if kind == "launched":
            run.status, run.since = "starting", event.get("ts") or run.since
        elif kind == "progress":
            run.status, run.step, run.target = "running", event["step"], event.get("target", run.target)
            reward = event.get("train_reward", event.get("reward"))
            if reward is None:
                reward = event.get("reward")
            if reward is not None:
                run.reward = reward
                run.rewards = [*run.rewards[-(_CURVE - 1):], reward]
                run.points = [*run.points[-(_CURVE - 1):], (int(event["step"]), float(reward))]
        elif kind == "ended":
            run.status, run.step = event.get("status", "ended"), event.get("step", run.step)
        elif kind == "unparked":
            run.status = "running"


def _clock(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else "--:--:--"


def _fields(event: Event, skip: tuple[str, ...] = ("id", "ts", "kind")) -> str:
    parts = []
    for name, value in event.items():
        if name in skip or value is None or value == "":
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        parts.append(f"{name}={value}")
    return " ".join(parts)


def format_line(event: Event) -> str:
    """One event as one plain line: ``#id HH:MM:SS kind field=value …``."""
    return f"#{event['id']} {_clock(event.get('ts'))} {event.get('kind')} {_fields(event)}".rstrip()


def _describe(event: Event) -> str:
    kind = event.get("kind")
    if kind == "framed":
        return f"framed: {event.get('question')}"
    if kind == "planned":
        why = f" — {event['rationale']}" if event.get("rationale") else ""
        return f"planned iteration {event.get('iteration')}: {', '.join(event.get('experiments') or [])}{why}"
    if kind == "decided":
        return f"decided to {event.get('action')}: {event.get('reason')}"
    if kind == "llm_call":
        state = f"error: {event['error']}" if event.get("error") else event.get("summary") or ""
        return f"LLM {event.get('step')} ({event.get('tokens')} tokens, {event.get('seconds')} s): {state}"
    if kind == "takeover":
        return f"the offline planner took over {event.get('step')}: {event.get('reason')}"
    if kind == "validated":
        verdict = "passed" if event.get("ok") else f"failed: {event.get('error')}"
        return f"validation attempt {event.get('attempt')} {verdict}"
    if kind == "client":
        return f"{'repaired' if event.get('repaired') else 'wrote'} the client of iteration {event.get('iteration')}"
    if kind == "session":
        return f"researcher session {event.get('action')} (pid {event.get('pid')}, {event.get('planner')} planner)"
    if kind == "launched":
        return f"launched {event.get('key')} ({event.get('experiment')}, seed {event.get('seed')})"
    if kind == "ended":
        return f"{event.get('key')} ended {event.get('status')} at step {event.get('step')}: {event.get('reason') or ''}"
    if kind == "client_restart":
        return f"{event.get('key')}: client restarted at step {event.get('step')}"
    if kind == "unparked":
        return f"{event.get('key')} resumed from its checkpoint at step {event.get('step')}"
    if kind == "watchdog":
        what = event.get("key") or event.get("reason") or ""
        return f"watchdog {event.get('name')}: {what}"
    if kind == "parked":
        return f"parked in phase {event.get('phase')} ({event.get('runs')} run(s) checkpointed): {event.get('reason')}"
    if kind == "report":
        answer = str(event.get("answer") or "")
        return f"report ({event.get('phase')}): {answer[:200]}{'…' if len(answer) > 200 else ''}"
    return f"{kind} {_fields(event)}"


def render(state: WatchState, now: float | None = None, width: int | None = None) -> RenderableType:
    """The live view; ``width`` (the console's) narrows the arm and curve columns below 100 columns."""
    now = time.time() if now is None else now
    head = Table.grid(padding=(0, 1))
    head.add_row("study", Text(state.study_id, style="bold"))
    since = ""
    if state.node_since:
        since = f" for {now - state.node_since:.0f} s" if state.node_running else f", left at {_clock(state.node_since)}"
    head.add_row("node", Text(f"{state.node or '-'}{since}", style="cyan"))
    head.add_row("doing", state.doing or "-")
    head.add_row("phase", state.phase or "-")
    head.add_row("events", f"{state.last_id} (last at {_clock(state.last_ts)})")

    prefix = f"{state.study_id}/"  # run keys are shown without the study id the header already names
    decisions = Table.grid()
    for event in state.decisions:
        decisions.add_row(Text(f"{_clock(event.get('ts'))} {_describe(event)}".replace(prefix, ""), overflow="fold"))

    runs = Table("run", "arm", "seed", "status", "step", "reward", "curve (shared step axis)", expand=False)
    for column in runs.columns[:4]:
        column.no_wrap = True  # the columns that tell runs apart are never cut
    ended = [run for run in state.runs.values() if run.status not in _LIVE]
    shown = ended[-_ENDED_SHOWN:] + [run for run in state.runs.values() if run.status in _LIVE]
    narrow = width is not None and width < 100
    curves = step_curves(shown, 12 if narrow else 24)
    arms = distinct(sorted({run.experiment for run in shown}), 16 if narrow else 32)
    for run in shown:
        style = "green" if run.status in _LIVE else ("dim" if run.status == "finished" else "yellow")
        step = f"{run.step}/{run.target}" if run.target else str(run.step)
        reward = "-" if run.reward is None else f"{run.reward:.3f}"
        runs.add_row(run.key.removeprefix(prefix), arms[run.experiment],
                     str(run.seed), Text(run.status, style=style), step, reward, curves[run.key])

    recent = Table.grid()
    for event in state.recent:
        recent.add_row(Text(f"{_clock(event.get('ts'))} {_describe(event)}".replace(prefix, ""), overflow="fold"))
    return Group(Panel(head, title="now"), Panel(decisions, title="planner: last decisions"),
                 Panel(runs, title="runs"), Panel(recent, title="recent events"))


def pick_study(studies_root: Path, artifacts_root: Path) -> str | None:
    """The study to watch when none is named: one that a researcher runs now, else the last active."""
    ids = overview.study_ids(studies_root, artifacts_root)
    layouts = [StudyLayout(sid, studies_root, artifacts_root) for sid in ids]
    running = [layout for layout in layouts if is_locked(layout)]

    def touched(layout: StudyLayout) -> float:
        paths = (events_path(layout), layout.graph_db, layout.study_toml)
        return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)

    chosen = max(running or layouts, key=touched, default=None)
    return chosen.study_id if chosen else None


def watch(layout: StudyLayout, console: Console, *, once: bool = False, tail: int = 20, interval_s: float = 0.25,
          stop: Callable[[], bool] = lambda: False) -> None:
    """Show the study live until ``stop`` (or Ctrl-C); see the module docstring for the modes."""
    state = WatchState(layout.study_id)
    follower = Follower(events_path(layout))
    history = follower.poll()
    for event in history:
        state.apply(event)
    if once:
        console.print(render(state, width=console.width))
        return
    if not console.is_terminal:
        print(f"watching study {layout.study_id}: {events_path(layout)}", flush=True)
        for event in history[-tail:] if tail else []:
            print(format_line(event), flush=True)
        for event in follower.follow(interval_s, stop):
            print(format_line(event), flush=True)
        return
    from rich.live import Live

    with Live(render(state, width=console.width), console=console, refresh_per_second=4, screen=False) as live:
        while not stop():
            for event in follower.poll():
                state.apply(event)
            live.update(render(state, width=console.width))
            time.sleep(interval_s)
