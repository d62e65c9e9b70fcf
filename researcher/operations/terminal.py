"""Terminal output of the CLI: one console (a terminal's width; in a pipe plain text at most
``PIPE_WIDTH`` columns, lines never wrapped), the printer of a study's events, how a session ended, and
the tables of ``researcher status`` and ``researcher list``. Tables keep their identifying columns
whole and shorten long text from the middle (``fit``), so two names that differ only at the end stay
apart."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from researcher.operations import overview
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState

PIPE_WIDTH = 100  # tables fit this many columns in a pipe or file; text lines are never wrapped there


def _console() -> Console:
    """Rich output wrapped at a terminal's width; into a pipe or file (a daemon's log, ``| tee``) plain
    lines, tables at most ``PIPE_WIDTH`` wide (rich's default there, 80 columns, broke ``deadline
    21:39:31`` across two lines: ``soft_wrap`` keeps text lines whole)."""
    console = Console()
    return console if console.is_terminal else Console(width=PIPE_WIDTH, soft_wrap=True, no_color=True)


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, shortened from the middle (``does-a-l…than-3e-6``)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def distinct(names: list[str], width: int) -> dict[str, str]:
    """Each name in at most ``width`` characters, keeping what tells it from the others: a name too
    long loses the start and end it shares with all of them (``…size-16…`` beside ``…size-8…``)."""
    if len(names) < 2:
        return {name: fit(name, width) for name in names}
    start = len(os.path.commonprefix(names))  # noqa: RUF071 - characters, on purpose: cut at any character
    start = names[0].rfind("-", 0, max(0, start - 1)) + 1  # keep the differing word's own name (``size-16``)
    end = len(os.path.commonprefix([name[::-1] for name in names]))  # noqa: RUF071 - as above
    end = max(0, end - names[0][len(names[0]) - end:].find("-")) if end else 0  # the shared tail from a "-"
    shown = {}
    for name in names:
        if len(name) <= width:
            shown[name] = name
            continue
        core = name[start:max(start, len(name) - end)] or name
        lead = "…" if start else ""
        tail = "…" if end and core is not name else ""
        shown[name] = lead + fit(core, width - len(lead) - len(tail)) + tail
    return shown



out = _console()


def printer() -> Callable[[str, Mapping[str, object]], None]:
    """The study's events as terminal lines (``researcher start`` without ``--quiet``): progress once
    per 5 steps a run, the analysis and report in full, the rest as ``kind key=value``."""
    shown: dict[str, int] = {}

    def emit(event: str, data: Mapping[str, Any]) -> None:  # the event's fields, typed by its kind
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        if event == "progress":
            last = shown.get(data["key"], -10)
            if data["step"] - last < 5 and data["step"] < data["target"]:
                return  # one line per 5 steps per run keeps the terminal readable
            shown[data["key"]] = data["step"]
            reward = "-" if data.get("reward") is None else f"{data['reward']:.3f}"
            out.print(f"[dim]{stamp}[/dim] {data['experiment']} seed {data['seed']}: step "
                      f"{data['step']}/{data['target']} reward {reward}", highlight=False)
        elif event == "analyzed":
            # ``best`` and the lines under it are the whole study's, on the verdict's axis and metric.
            out.print(f"[dim]{stamp}[/dim] [bold]iteration {data['iteration']}[/bold] analysed; highest AUC over the "
                      f"whole study: {data['best']}", highlight=False)
            for line in data["lines"]:
                out.print(f"    {line}", highlight=False)
        elif event == "planned":
            out.print(f"[dim]{stamp}[/dim] [cyan]planned[/cyan] iteration {data['iteration']}: "
                      f"{', '.join(data['experiments'])}; {data['seeds']} seed(s) each", highlight=False)
        elif event == "report":
            out.print(f"[dim]{stamp}[/dim] [bold green]report[/bold green] {data['path']}\n{data['answer']}",
                      highlight=False)
        else:
            details = " ".join(f"{k}={v}" for k, v in data.items())
            out.print(f"[dim]{stamp}[/dim] [cyan]{event}[/cyan] {details}", highlight=False)

    return emit


def print_ending(state: StudyState, layout: StudyLayout) -> str | None:
    """How a session ended (done, stopped, parked), or the error of one that failed (None otherwise)."""
    phase = state.get("phase")
    if phase == "done":
        out.print(f"[green]study {layout.study_id} done[/green]: {layout.report_md}")
        return None
    if phase == "stopped":
        out.print(f"[yellow]study {layout.study_id} stopped[/yellow]: {layout.report_md}")
        return None
    if phase == "parked":
        parked = state.get("parked") or {}
        out.print(f"[yellow]study {layout.study_id} parked[/yellow] in phase {parked.get('phase')}: "
                  f"{parked.get('reason')}. `researcher resume {layout.study_id}` (or the daemon's next window) "
                  "continues it.", highlight=False)
        return None
    return state.get("error") or f"study {layout.study_id} ended in phase {phase}"


def print_status(rows: list[dict]) -> None:
    """``researcher status``: each study's summary (``overview.summary``), then its runs' placements."""
    for row in rows:
        table = Table(title=f"study {row['study_id']}", show_header=False)
        for key, text in overview.readable(row):
            table.add_row(key, text)
        out.print(table)
        if row.get("placements"):
            runs_table = Table("run", "status", "placement", "node", "resources", "gpus", "queued")
            runs_table.columns[0].no_wrap = runs_table.columns[1].no_wrap = True
            for place in row["placements"]:
                runs_table.add_row(place["key"].removeprefix(f"{row['study_id']}/"), place["status"],
                                   place["placement"], fit(place["node"] or "-", 16),
                                   ", ".join(f"{k} {v:g}" for k, v in place["resources"].items()) or "-",
                                   ",".join(place["devices"]) or "-", f"{place['queued_s']:.0f} s")
            out.print(runs_table)


def print_study_list(rows: list[dict]) -> None:
    """``researcher list``: one line a study (its ``overview.summary``)."""
    table = Table("study", "state", "active", "iteration", "runs", "deadline", "topic")
    for column in table.columns[:2]:
        column.no_wrap = True
    room = max(24, out.width - 78)  # what the other columns leave the topic
    for row in rows:
        table.add_row(fit(row["study_id"], 40), row["state"], "yes" if row["active"] else "", str(row["iteration"]),
                      str(row["runs"]["launched"]), row["deadline"] or "", fit(row["topic"] or "", room))
    out.print(table)
