"""``researcher campaign start|resume|status|scorecard``: many hypotheses over days, one ledger.

``start FILE.toml --budget 72h [--window 22:00-07:00]`` (or ``start --goal "…" --budget 8h``) writes
the campaign and runs it. With a window it also schedules itself daily at the window's start (``researcher
daemon`` runs it), and runs now only inside the window. ``resume ID [--window 8h]`` continues it;
``status`` shows the ledger's table; ``scorecard ID`` prints a line per claim and the ``RESULT`` line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from researcher.campaign import ledger, record, runner, spec
from researcher.campaign.levels import describe
from researcher.operations import scheduler, terminal
from researcher.study.flags import parse_duration
from researcher.study.layout import check_study_id, slugify
from researcher.study.store import StudyBusy

app = typer.Typer(help="Campaigns: many hypotheses over days, with a ledger and a replication scorecard.",
                  no_args_is_help=True, add_completion=False)
out = terminal.out
StudiesDir = Annotated[Path, typer.Option("--studies-dir", help="where study and campaign folders are written")]
ArtifactsDir = Annotated[Path, typer.Option("--artifacts-dir", help="where run outputs and mlflow.db go")]


def _fail(message: str, code: int = 2) -> NoReturn:
    out.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def parse_window(text: str) -> tuple[str, float]:
    """``22:00-07:00`` as (its start ``HH:MM``, its length in seconds); a window may cross midnight."""
    try:
        begin, end = (part.strip() for part in text.split("-"))
        start, stop = (dt.datetime.strptime(p, "%H:%M") for p in (begin, end))
    except ValueError:
        raise ValueError(f"--window {text!r}: give HH:MM-HH:MM (local time), e.g. 22:00-07:00") from None
    length = (stop - start).total_seconds() % 86_400
    if length == 0:
        raise ValueError(f"--window {text!r} opens and closes at the same time")
    return begin, length


def open_now(window: tuple[str, float], now: dt.datetime) -> float:
    """Seconds left in the window at ``now`` (0 when it is closed)."""
    start = scheduler.clock_time_today(window[0], now)
    for opened in (start - dt.timedelta(days=1), start):
        left = (opened + dt.timedelta(seconds=window[1]) - now).total_seconds()
        if opened <= now and left > 0:
            return left
    return 0.0


def _say(line: str) -> None:
    out.print(f"[dim]{dt.datetime.now():%H:%M:%S}[/dim] {line}", highlight=False)


def _run(name: str, studies_dir: Path, artifacts_dir: Path, window_s: float | None) -> None:
    try:
        rec = runner.run(name, studies_dir, artifacts_dir, window_s=window_s, say=_say)
    except StudyBusy:
        _fail(f"campaign {name} is already being run by another researcher process")
    except KeyboardInterrupt:
        _fail(f"interrupted: `researcher campaign resume {name}` continues the campaign", 130)
    spec_, rec = runner.load(studies_dir.resolve(), name)
    for line in ledger.scorecard(spec_, rec):
        print(line)
    out.print(f"ledger: {record.folder(studies_dir.resolve(), name) / record.LEDGER_FILE}", highlight=False)


def goal_file(goal: str, name: str | None, now: dt.datetime) -> str:
    """The campaign file a ``--goal`` stands for (kept in the campaign folder as if it had been given)."""
    chosen = check_study_id(name or f"{slugify(goal, 32)}-{now:%m%d-%H%M%S}")
    return f"[campaign]\nname = {json.dumps(chosen)}\ngoal = {json.dumps(goal)}\n"


@app.command()
def start(file: Annotated[Path | None, typer.Argument(help="the campaign file (TOML); or give --goal")] = None,
          budget: Annotated[str, typer.Option(help="running time the campaign may spend, e.g. 30m, 72h")] = "",
          goal: Annotated[str | None, typer.Option(help=(
              "pursue this goal on its own, round after round: a task and an objective, e.g. \"Make the letters "
              "task learn faster per episode consumed\""))] = None,
          name: Annotated[str | None, typer.Option(help="with --goal: the campaign's name (default: from the goal)")] = None,
          window: Annotated[str | None, typer.Option(help="run only between these local times daily, e.g. "
                                                          "22:00-07:00 (`researcher daemon` resumes it)")] = None,
          studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
          verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Start a campaign: check every claim (or read the goal), write its folder and ledger, and run it."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    if not budget:
        _fail("--budget is required, e.g. --budget 8h")
    if (file is None) == (goal is None):
        _fail("give a campaign file or --goal \"…\", not both" if file else "give a campaign file or --goal \"…\"")
    try:
        if goal is not None:
            text = goal_file(goal, name, dt.datetime.now())
            parsed = spec.parse(text, "--goal")
        else:
            assert file is not None
            parsed, text = spec.load(file)
        budget_s = parse_duration(budget)
        daily = parse_window(window) if window else None
        rec = runner.create(parsed, text, budget_s, daily, studies_dir.resolve(), artifacts_dir.resolve())
    except ValueError as exc:
        _fail(str(exc))
    name = rec.name
    what = f"goal: {rec.goal.describe()}" if rec.goal else f"{len(rec.claims)} claims"
    out.print(f"campaign [bold]{name}[/bold]: {what}, budget {budget} of running time · "
              f"ledger {record.folder(studies_dir.resolve(), name) / record.LEDGER_FILE}", highlight=False)
    window_s = None
    if daily is not None:
        when = scheduler.schedule(name, scheduler.ScheduleSpec(window_s=daily[1], at=daily[0]),
                                  studies_dir.resolve(), artifacts_dir.resolve())
        window_s = open_now(daily, dt.datetime.now().astimezone())
        out.print(f"scheduled daily at {daily[0]} for {daily[1] / 3600:g} h (next {when:%Y-%m-%d %H:%M}); "
                  "`researcher daemon` runs it", highlight=False)
        if window_s <= 0:
            return
    _run(name, studies_dir, artifacts_dir, window_s)


@app.command()
def resume(campaign_id: str, window: Annotated[str | None, typer.Option(help="park after this long, e.g. 8h")] = None,
           studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
           verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Continue a campaign where it stopped (a killed session's study is waited for, never run twice)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        name = check_study_id(campaign_id)
        window_s = parse_duration(window) if window else None
        runner.load(studies_dir.resolve(), name)
    except ValueError as exc:
        _fail(str(exc))
    _run(name, studies_dir, artifacts_dir, window_s)


@app.command()
def status(campaign_id: Annotated[str | None, typer.Argument()] = None,
           json_: Annotated[bool, typer.Option("--json")] = False,
           studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """A campaign's ledger table (every campaign's one line without an id)."""
    names = [campaign_id] if campaign_id else record.names(studies_dir.resolve())
    rows = []
    for name in names:
        try:
            spec_, rec = runner.load(studies_dir.resolve(), name)
        except ValueError as exc:
            _fail(str(exc))
        rows.append((spec_, rec))
    if json_:
        data = [rec.model_dump() for _, rec in rows]
        print(json.dumps(data[0] if campaign_id else data, indent=2))
        return
    if not rows:
        print(f"no campaign under {studies_dir}")
    for spec_, rec in rows:
        if campaign_id:
            print(ledger.render(spec_, rec).split("\n## ", 1)[0].rstrip())
        else:
            state = f"ended: {rec.ended}" if rec.ended else "running" if rec.session else "parked"
            d = rec.discovery
            search = (f" · round {d.round} ({d.step}), incumbent {describe(d.incumbent, d.defaults)}"
                      if d is not None and not d.converged else "")
            print(f"{rec.name}: {len(rec.claims)} claims, {rec.spent_s / 3600:.2f} of {rec.budget_s / 3600:.2f} h "
                  f"spent, {state}{search}")


@app.command()
def scorecard(campaign_id: str, studies_dir: StudiesDir = Path("studies"),
              artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """One line per claim (expected, verdict, agreement, seeds, CPU-hours), then the RESULT line."""
    try:
        spec_, rec = runner.load(studies_dir.resolve(), check_study_id(campaign_id))
    except ValueError as exc:
        _fail(str(exc))
    for line in ledger.scorecard(spec_, rec):
        print(line)
