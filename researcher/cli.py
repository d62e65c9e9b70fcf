"""``researcher …``: the command-line verbs, one function each: flags parsed, one call, output and exit
code. Running a study is ``researcher.session``'s: its ``runner`` (``start_study``, ``resume_study``)
prepares the study first (``preparation``: settings, options, data, their checks), through the one
composition root (``composition``: ``ResearcherSettings`` and the study's collaborators); terminal
output is ``researcher.operations.terminal``'s.

Environment read here: RESEARCHER_RAY_ADDRESS (place runs on a Ray cluster, like --ray-address); the
rest is listed in ``researcher.session.composition``.

Only the verbs that run a study (start, resume) import ``researcher.session.runner`` and with it the
graph; status, list, stop and the scheduler verbs read the study's files through ``researcher.study.store``.
``start`` runs past 60 lines only because typer declares its two dozen flags in its signature.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from researcher.campaign import commands as campaign_commands
from researcher.evidence import run_table
from researcher.operations import overview, scheduler, terminal
from researcher.runs.launcher import Launcher
from researcher.session.composition import build_settings
from researcher.session.preparation import DataFlags, Prepared, Refused, StartRequest
from researcher.study import events, store
from researcher.study.flags import parse_duration
from researcher.study.layout import StudyLayout, check_study_id
from researcher.study.state import StudyState, framing_metric
from researcher.tracking import review_view
from researcher.tracking.tracker import Tracker
from researcher.types.failures import is_disk_full
from swarm import stopping

app = typer.Typer(help="An autonomous researcher that runs RL studies on swarm servers.", no_args_is_help=True,
                  add_completion=False)
app.add_typer(campaign_commands.app, name="campaign")
log = logging.getLogger(__name__)
DAEMON_PORT = 8787  # the daemon's study events server; a busy port falls back to a free one (daemon.json)


out = terminal.out

StudiesDir = Annotated[Path, typer.Option("--studies-dir", help="where study folders are written")]
ArtifactsDir = Annotated[Path, typer.Option("--artifacts-dir", help="where run outputs and mlflow.db go")]


def _fail(message: str, code: int = 1) -> NoReturn:
    out.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # Fail fast on an unreachable tracking server (the tracker spools and retries itself) instead
    # of MLflow's default of 7 retries with exponential backoff, minutes per call.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


def _finish(state: StudyState, layout: StudyLayout) -> None:
    error = terminal.print_ending(state, layout)
    if error is not None:
        _fail(error, 3)


@app.command()
def start(
    topic: Annotated[str, typer.Option(help="the research question, in plain words")],
    budget: Annotated[str | None, typer.Option(help="wall-time budget, e.g. 10m, 2h")] = None,
    until: Annotated[str | None, typer.Option(help="absolute deadline (ISO 8601) instead of --budget")] = None,
    study_id: Annotated[str | None, typer.Option(help="default: derived from the topic and the time")] = None,
    server: Annotated[list[str] | None, typer.Option(help="use this existing swarm server (repeatable)")] = None,
    max_runs: Annotated[int | None, typer.Option(min=1, help="training runs the study may launch")] = None,
    steps_per_run: Annotated[int | None, typer.Option(min=1, help="training steps per run")] = None,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds per configuration")] = None,
    seed_base: Annotated[int | None, typer.Option(
        min=0, help="added to every run's seed: rerun a study on fresh seeds")] = None,
    parallel: Annotated[int | None, typer.Option(min=1, help="runs alive at once (default 2)")] = None,
    max_iterations: Annotated[int | None, typer.Option(min=1, help="looks at the data: the pilot, then each added "
                                                                   "batch of seeds (default 3)")] = None,
    min_effect: Annotated[float | None, typer.Option(min=0, help=(
        "the smallest difference in reward AUC that matters (default 0.02): sizes the study"))] = None,
    couple: Annotated[bool | None, typer.Option("--couple/--no-couple", help=(
        "paired arms share their tasks and sampling noise (swarm serve --coupled) where the torch engine runs "
        "them and they differ (default: on)"), show_default=False)] = None,
    eval_samples: Annotated[int | None, typer.Option(min=1, max=64, help=(
        "each held-out task's episodes a round (default: the study client's EVAL_SAMPLES, else 1); with 2 or more "
        "the report gives one round's sampling noise against min_effect/4"))] = None,
    max_llm_tokens: Annotated[int | None, typer.Option(min=0, help="planner LLM token budget")] = None,
    max_llm_cost: Annotated[float | None, typer.Option(min=0, help="planner LLM cost budget (USD)")] = None,
    model: Annotated[str | None, typer.Option(help=(
        "what every run's `swarm serve --model` loads (default: each experiment's config.toml `model`, else tiny)"))] = None,
    gpus_per_run: Annotated[float | None, typer.Option(min=0, help=(
        "GPUs each run gets (0.5: two runs share a device; default 1 where there are GPUs)"),
        rich_help_panel="Placement")] = None,
    run_resources: Annotated[str | None, typer.Option(help=(
        "resources each run asks for, as JSON: '{\"GPU\": 1, \"node_b\": 1}'"), rich_help_panel="Placement")] = None,
    ray_address: Annotated[str | None, typer.Option(help=(
        "place runs on this Ray cluster: HOST:PORT (what `ray start --head` prints), auto, ray://HOST:PORT or the "
        "dashboard's http://HOST:8265 (env RESEARCHER_RAY_ADDRESS)"),
        rich_help_panel="Placement")] = None,
    window: Annotated[str | None, typer.Option(help="end this session after this long (park; resume later)")] = None,
    data: Annotated[str | None, typer.Option(metavar="FILE|FOLDER[:SPLIT]|ORG/NAME[:CONFIG][:SPLIT]", help=(
        "study your own data instead of the examples: a jsonl or parquet file (verl's RL rows or {prompt, answer}), "
        "a datasets save_to_disk folder or a Hugging Face dataset name (loaded once, snapshotted into the study)"),
        rich_help_panel="Your data")] = None,
    reward: Annotated[str, typer.Option(help="with --data: verl, exact, a verl data_source, or PATH:FUNC",
                                        rich_help_panel="Your data")] = "verl",
    heldout: Annotated[str | None, typer.Option(metavar="FILE|FOLDER[:SPLIT]|ORG/NAME[:CONFIG][:SPLIT]", help=(
        "with --data: the held-out data, as --data takes it (default: 10% of the rows by a stable hash)"),
        rich_help_panel="Your data")] = None,
    prompt_key: Annotated[str, typer.Option(help="with --data: the column holding the prompt",
                                            rich_help_panel="Your data")] = "prompt",
    answer_key: Annotated[str | None, typer.Option(help=(
        "with --data: the column holding the answer (the text after '####' is the ground truth); default: "
        "reward_model.ground_truth, else answer"), show_default=False, rich_help_panel="Your data")] = None,
    warmup_steps: Annotated[int, typer.Option(min=0, help=(
        "with --data: supervised warm-up steps on the rows' answers on each fresh server"),
        rich_help_panel="Your data")] = 0,
    data_config: Annotated[Path | None, typer.Option(help=(
        "with --data: the task's server config (default: studies/examples/arith/config.toml)"),
        rich_help_panel="Your data")] = None,
    park_after_look: Annotated[bool, typer.Option("--park-after-look", help=(
        "park after each look that does not conclude (a campaign resumes it)"), rich_help_panel="Campaigns")] = False,
    baseline: Annotated[str | None, typer.Option(help=(
        "config keys every arm starts from, as JSON (a campaign's settled findings)"),
        rich_help_panel="Campaigns")] = None,
    design: Annotated[str | None, typer.Option(help=(
        "the arms to run instead of planning them, as JSON: {task, shape, arms: [{name, overrides}], factors} "
        "(a discovery campaign's stage)"), rich_help_panel="Campaigns")] = None,
    alpha: Annotated[float | None, typer.Option(min=0.0001, max=0.4999, help=(
        "the study's two-sided false-positive rate over all its looks (default 0.05)"),
        rich_help_panel="Campaigns")] = None,
    keep_training_state: Annotated[bool, typer.Option("--keep-training-state", help=(
        "keep each ended run's optimizer state and KL reference (default: its checkpoints keep the weights only)"))] = False,
    allow_unboxed: Annotated[bool, typer.Option("--allow-unboxed", help=(
        "run LLM-written study code even where the OS sandbox (bubblewrap) cannot be built; the report says so"))] = False,
    studies_dir: StudiesDir = Path("studies"),
    artifacts_dir: ArtifactsDir = Path("artifacts"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Start a study: frame the topic, plan, run and analyse experiments, and write the report."""
    from researcher.runs.sandbox import unboxed_refusal
    from researcher.session import runner

    _setup_logging(verbose)
    refusal = unboxed_refusal(llm_written=build_settings(studies_dir, artifacts_dir).llm is not None,
                              allow_unboxed=allow_unboxed)
    if refusal:
        _fail(refusal, 2)
    stopping.interrupt_on_sigterm()  # SIGTERM takes Ctrl-C's path, within a deadline
    request = StartRequest(
        topic=topic, studies_dir=studies_dir, artifacts_dir=artifacts_dir, budget=budget, until=until,
        study_id=study_id, servers=server, window=window,
        options={"max_runs": max_runs, "steps_per_run": steps_per_run, "seeds": seeds, "seed_base": seed_base,
                 "parallel_runs": parallel, "max_iterations": max_iterations, "min_effect": min_effect,
                 "couple": couple, "eval_samples": eval_samples,
                 "max_llm_tokens": max_llm_tokens, "max_llm_cost_usd": max_llm_cost, "model": model,
                 "gpus_per_run": gpus_per_run, "run_resources": run_resources,
                 "ray_address": ray_address or os.environ.get("RESEARCHER_RAY_ADDRESS") or None,
                 "park_after_look": park_after_look or None, "baseline": baseline, "design": design,
                 "alpha": alpha, "allow_unboxed": allow_unboxed or None,
                 "keep_training_state": keep_training_state or None},
        data=None if data is None else DataFlags(source=data, reward=reward, heldout=heldout, prompt_key=prompt_key,
                                                 answer_key=answer_key, warmup_steps=warmup_steps, config=data_config))
    try:
        state, layout = runner.start_study(request, printer=terminal.printer(), announce=_announce)
    except (Refused, FileExistsError, store.StudyBusy) as exc:
        _fail(str(exc), 2)
    except runner.Interrupted as exc:
        _interrupted(exc.study_id)
    _finish(state, layout)


def _announce(prepared: Prepared) -> None:
    ctx = prepared.ctx
    out.print(f"study [bold]{ctx.layout.study_id}[/bold] · planner {ctx.planner.name} · deadline "
              f"{dt.datetime.fromtimestamp(prepared.deadline):%H:%M:%S} · studies {ctx.layout.study_dir}")


def _interrupted(study_id: str) -> NoReturn:
    """Ctrl-C or SIGTERM (``swarm.stopping``): the graph's last checkpoint stands; the runs, started in
    their own sessions to outlive the researcher, train on until a resume re-attaches or a stop ends them."""
    _fail(f"interrupted: `researcher resume {study_id}` continues the study; its runs train on meanwhile "
          f"(`researcher stop {study_id}` ends them)", 130)


@app.command()
def resume(study_id: str, studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
           window: Annotated[str | None, typer.Option(help="end this session after this long, e.g. 8h (park)")] = None,
           verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Continue a study from its last checkpoint (re-attaching to runs that are still alive)."""
    from researcher.session import runner

    _setup_logging(verbose)
    stopping.interrupt_on_sigterm()  # SIGTERM takes Ctrl-C's path, within a deadline
    try:
        window_s = parse_duration(window) if window else None
        state = runner.resume_study(study_id, studies_dir, artifacts_dir, terminal.printer(), window_s)
    except (ValueError, store.StudyNotFound, store.StudyBusy) as exc:
        _fail(str(exc), 2)
    except KeyboardInterrupt:
        _interrupted(study_id)
    except Exception as exc:  # a full disk can refuse even the read of the study's state (SQLite's WAL)
        if not is_disk_full(exc):
            raise
        out.print(f"[yellow]study {study_id} not resumed[/yellow]: the disk is full ({exc}); free some space and "
                  f"`researcher resume {study_id}` continues it from its last checkpoint.", highlight=False)
        raise typer.Exit(0) from None
    _finish(state, StudyLayout(study_id, studies_dir.resolve(), artifacts_dir.resolve()))


@app.command()
def status(study_id: Annotated[str | None, typer.Argument()] = None, json_: Annotated[bool, typer.Option("--json")] = False,
           studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """Show a study's state, iteration, runs and deadline (all studies without an id)."""
    ids = [study_id] if study_id else overview.study_ids(studies_dir, artifacts_dir)
    rows = []
    for sid in ids:
        layout = StudyLayout(sid, studies_dir.resolve(), artifacts_dir.resolve())
        if not layout.graph_db.is_file() and not layout.study_toml.is_file():
            _fail(f"no study {sid!r} under {studies_dir} / {artifacts_dir}", 2)
        rows.append(overview.summary(layout))
    overview.add_wakeups(rows, artifacts_dir.resolve())
    if json_:
        print(json.dumps(rows[0] if study_id else rows, indent=2, default=str))
        return
    terminal.print_status(rows)


@app.command("list")
def list_(studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """List the studies on disk."""
    terminal.print_study_list([overview.summary(StudyLayout(sid, studies_dir.resolve(), artifacts_dir.resolve()))
                               for sid in overview.study_ids(studies_dir, artifacts_dir)])


@app.command()
def report(study_id: str, studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
           mlflow: Annotated[bool, typer.Option(help="also log the review to the study's MLflow parent runs")] = False) -> None:
    """Render the study's review (comparison table + reward curves) as Markdown with PNG plots, after its report."""
    _setup_logging(False)
    try:
        layout = StudyLayout(check_study_id(study_id), studies_dir.resolve(), artifacts_dir.resolve())
    except ValueError as exc:
        _fail(str(exc), 2)
    if not layout.graph_db.is_file() and not layout.study_toml.is_file():
        _fail(f"no study {study_id!r} under {studies_dir} / {artifacts_dir}", 2)
    state = store.read_state(layout) or {}
    written = run_table.write(layout, framing_metric(state))
    if mlflow:
        settings = build_settings(studies_dir, artifacts_dir)
        tracker = Tracker(settings.mlflow_uri(), settings.mlflow_artifact_root(), layout.artifacts_dir / "mlflow_spool")
        run_table.log_to_mlflow(tracker, layout, written)
    if layout.report_md.is_file():
        print(layout.report_md.read_text())
    else:
        print(f"(no report.md yet: the study is {state.get('phase', 'not started')})\n")
    print(written.md.read_text())
    print(f"Files: {written.md} · {written.csv} · {written.png}")


@app.command("schedule")
def schedule_(
    study_id: str,
    at: Annotated[str | None, typer.Option(
        help="daily at HH:MM[:SS] local time, or once at an ISO date-time such as 2026-12-01T02:00 "
             "(with --every: the first time)")] = None,
    cron: Annotated[str | None, typer.Option(help='crontab "M H dom mon dow" (or 6 fields, seconds first)')] = None,
    every: Annotated[str | None, typer.Option(help="repeat at this interval, e.g. 6h")] = None,
    window: Annotated[str, typer.Option(help="how long each session may run before it parks")] = "8h",
    studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
) -> None:
    """Resume a study on a schedule (run `researcher daemon` to act on it)."""
    try:
        check_study_id(study_id)
        spec = scheduler.ScheduleSpec(window_s=parse_duration(window), at=at, cron=cron,
                                      every_s=parse_duration(every) if every else None)
        spec.check_future()
    except ValueError as exc:
        _fail(str(exc), 2)
    layout = StudyLayout(study_id, studies_dir.resolve(), artifacts_dir.resolve())
    if not layout.graph_db.is_file():
        _fail(f"no study {study_id!r} under {artifacts_dir}; `researcher start` it first", 2)
    try:
        when = scheduler.schedule(study_id, spec, studies_dir.resolve(), artifacts_dir.resolve())
    except ValueError as exc:  # a one-shot time that passed meanwhile
        _fail(str(exc), 2)
    sessions = f"one {window} session" if spec.once else f"{window} windows"
    out.print(f"scheduled [bold]{study_id}[/bold] (job {scheduler.job_id(study_id)}): next session "
              f"{when.isoformat(timespec='seconds') if when else 'never'}, {sessions}; "
              f"`researcher daemon` runs it", highlight=False)


@app.command()
def unschedule(study_id: str, studies_dir: StudiesDir = Path("studies"),
               artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """Stop resuming a study on its schedule."""
    try:
        check_study_id(study_id)
    except ValueError as exc:
        _fail(str(exc), 2)
    if not scheduler.unschedule(study_id, studies_dir.resolve(), artifacts_dir.resolve()):
        _fail(f"study {study_id!r} has no schedule", 2)
    out.print(f"unscheduled {study_id}")


@app.command()
def daemon(studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts"),
           poll: Annotated[float, typer.Option(min=0.5, help="seconds between syncs with the schedule files")] = 30.0,
           port: Annotated[int, typer.Option(min=0, max=65535, help=(
               "loopback port of the study events server (SSE); 0 picks a free one (both written to daemon.json)"))]
           = DAEMON_PORT,
           verbose: Annotated[bool, typer.Option("--verbose", "-v")] = True) -> None:
    """Run the scheduler in the foreground: resume scheduled studies in their windows (Ctrl-C to quit).

    Also serves each study's events as Server-Sent Events on loopback: GET /studies/STUDY/events with
    the bearer token in ARTIFACTS/daemon.token."""
    from researcher.operations.daemon import run_daemon

    _setup_logging(verbose)
    out.print(f"researcher daemon: store {scheduler.store_url(artifacts_dir)}; studies {studies_dir.resolve()}")
    run_daemon(studies_dir, artifacts_dir, poll_s=poll, port=port,
               announce=lambda line: out.print(line, highlight=False))


@app.command()
def watch(study_id: Annotated[str | None, typer.Argument(help=(
              "the study (default: the one a researcher runs now, else the last active)"))] = None,
          once: Annotated[bool, typer.Option("--once", help="print the current view and exit")] = False,
          tail: Annotated[int, typer.Option(min=0, help="not a terminal: earlier events printed before new ones")] = 20,
          studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """Watch a study live: current node, the planner's decisions, live runs with reward curves, recent events.

    Reads the study's event log only (a study run by another process, across restarts). Into a pipe:
    one line per event as it comes."""
    from researcher.operations import watch as watching

    studies_root, artifacts_root = studies_dir.resolve(), artifacts_dir.resolve()
    if study_id is None:
        study_id = watching.pick_study(studies_root, artifacts_root)
        if study_id is None:
            _fail(f"no study under {studies_dir} / {artifacts_dir}", 2)
    try:
        layout = StudyLayout(check_study_id(study_id), studies_root, artifacts_root)
    except ValueError as exc:
        _fail(str(exc), 2)
    if not (layout.study_toml.is_file() or layout.graph_db.is_file() or events.events_path(layout).is_file()):
        _fail(f"no study {study_id!r} under {studies_dir} / {artifacts_dir}", 2)
    try:
        watching.watch(layout, out, once=once, tail=tail)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
def stop(study_id: str, studies_dir: StudiesDir = Path("studies"), artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """Ask a running study to stop its runs and write its report; with no researcher running, stop its runs."""
    layout = StudyLayout(check_study_id(study_id), studies_dir.resolve(), artifacts_dir.resolve())
    if not layout.graph_db.is_file():
        _fail(f"no study {study_id!r} under {artifacts_dir}", 2)
    store.request_stop(layout)
    if store.is_locked(layout):
        out.print(f"stop requested: the researcher running {study_id} will stop its runs and write the report")
        return
    launcher = Launcher(build_settings(studies_dir, artifacts_dir).swarm_command)
    stopped = launcher.stop_all(layout.runs_dir, "stopped", "researcher stop")
    out.print(f"no researcher is running {study_id}; stopped {stopped} run(s). `researcher resume {study_id}` "
              "continues it.")


@app.command()
def ui(study_id: Annotated[str | None, typer.Argument(help="link straight to this study's experiment")] = None,
       port: int = 5000, artifacts_dir: ArtifactsDir = Path("artifacts")) -> None:
    """Start the MLflow UI on the studies' tracking store (Ctrl-C to quit).

    The link opens MLflow's model-training view: without it MLflow 3.17 opens every experiment on its
    GenAI traces overview, where a study's runs and curves are not. A study's link opens its runs
    grouped by arm with the verdict's metric charted first (``researcher.tracking.review_view``); without
    a study, the newest studies' links follow the list's."""
    settings = build_settings(Path("studies"), artifacts_dir)
    uri = settings.mlflow_uri()
    from mlflow import MlflowClient

    client, root = MlflowClient(tracking_uri=uri), f"http://127.0.0.1:{port}"
    page, studies = review_view.experiment_page(None, with_view=False), list[str]()
    if study_id is not None:
        found = client.get_experiment_by_name(study_id)
        if found is None:
            _fail(f"no MLflow experiment for study {study_id!r} in {uri}", 2)
        page = review_view.experiment_page(found.experiment_id, with_view=review_view.VIEW_TAG in found.tags)
    else:  # a click in the list opens the browser's last view (GenAI at first): each study's own link too
        studies = review_view.study_links(root, client.search_experiments(order_by=["creation_time DESC"]))
    # One line a link however narrow the terminal (it wraps it, rich does not cut it): each stays whole to copy.
    out.print("\n".join([f"MLflow UI on {root}/#{page} (store {uri})", *studies]), soft_wrap=True, highlight=False)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1"]
    if uri.startswith("sqlite:"):
        argv += ["--default-artifact-root", settings.mlflow_artifact_root().as_uri()]
    raise typer.Exit(stopping.run_child(argv))  # SIGTERM or Ctrl-C end MLflow and its uvicorn: nothing keeps the port


def main() -> None:
    app()


if __name__ == "__main__":
    main()
