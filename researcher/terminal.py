"""Terminal output of the CLI: one console, wrapped at a terminal's width but never in a pipe, and
the printer of a study's events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping

from rich.console import Console

_PIPE_WIDTH = 10_000  # tables keep their natural width in a pipe or file; text is never wrapped there


def _console() -> Console:
    """Rich output wrapped at a terminal's width; into a pipe or file (a daemon's log, ``| tee``) whole
    lines: rich's default there is 80 columns, which broke ``deadline 21:39:31`` across two lines."""
    console = Console()
    return console if console.is_terminal else Console(width=_PIPE_WIDTH, soft_wrap=True)



out = _console()


def printer() -> Callable[[str, Mapping[str, object]], None]:
    """The study's events as terminal lines (``researcher start`` without ``--quiet``): progress once
    per 5 steps a run, the analysis and report in full, the rest as ``kind key=value``."""
    shown: dict[str, int] = {}

    def emit(event: str, data: Mapping[str, object]) -> None:
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
