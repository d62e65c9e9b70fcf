"""``swarm``: serve a model, run a study client against it, and watch and steer it.

This is the entry point: logging is configured here and, with ``SwarmClient``'s token defaults,
this is the only place the environment is read (``SWARM_TOKEN``, ``SWARM_CLIENT_TOKEN``,
``MLFLOW_TRACKING_URI``). Heavy imports (the server, torch) happen inside ``serve`` only, so every
other verb starts fast and a restarted ``swarm run`` with edited study code is claiming episodes
again within about a second.

Every verb that talks to a server finds its control token as: ``--token``, else ``$SWARM_TOKEN``,
else ``<state-dir>/token`` (written by ``swarm serve`` on loopback). ``swarm run`` claims with the
client token (``swarm.server.auth``): ``$SWARM_CLIENT_TOKEN``, else ``--token``/``$SWARM_TOKEN``, else
``<state-dir>/client_token``, else the control token file; a study's ``setup`` that calls control
routes (a supervised warm-up) uses the control token when one is at hand. ``swarm serve`` keeps both
tokens in its state dir (0700, files 0600), so a restart on the same state dir keeps them. People may
pass ``--token``; tools should pass tokens by environment or file, never on a command line (``ps``
shows it to every user). A missing URL falls back to ``<state-dir>/server.json``, which a running
``swarm serve`` writes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from swarm.client import SwarmClient, SwarmError, load_study, probe_study, run_study
from swarm.client._study import stop_on_sigterm

log = logging.getLogger(__name__)

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Swarm RL: a server that trains a model from any OpenAI-speaking agent.")
_PIPE_WIDTH = 10_000  # tables keep their natural width in a pipe or file; text is never wrapped there


def _console(stderr: bool = False) -> Console:
    """Rich output wrapped at a terminal's width; into a pipe or file, whole lines (rich's default
    there is 80 columns, which breaks log lines and values mid-way for anyone who greps them)."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=_PIPE_WIDTH, soft_wrap=True)


out = _console()
err = _console(stderr=True)

DEFAULT_STATE_DIR = Path("artifacts/swarm")
_QUICK_RETRY_S = 5.0  # one-shot verbs fail fast on a dead server instead of waiting out a restart

Url = Annotated[str | None, typer.Argument(help="server URL (default: the url in <state-dir>/server.json)",
                                           show_default=False)]
Token = Annotated[str | None, typer.Option(envvar="SWARM_TOKEN", show_envvar=True,
                                           help="control token (else $SWARM_TOKEN, else <state-dir>/token)")]
StateDir = Annotated[Path, typer.Option(help="where `swarm serve` keeps its token and state")]
AsJson = Annotated[bool, typer.Option("--json", help="print raw JSON (the protocol model)")]


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    # At a terminal rich's columns; elsewhere one plain line a record (a rich log table pads every line to the width).
    handler = RichHandler(console=err, show_path=False) if err.is_terminal else logging.StreamHandler(sys.stderr)
    plain = "" if err.is_terminal else "[%(asctime)s] %(levelname)-8s "
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=plain + "%(name)s: %(message)s",
                        datefmt="%X", handlers=[handler])
    for noisy in ("httpx", "httpcore", "openai", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)  # one line, paths unbroken
    raise typer.Exit(code)


def _server_url(url: str | None, state_dir: Path) -> str:
    if url:
        return url
    try:
        return str(json.loads((state_dir / "server.json").read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        _fail(f"no server URL given and no running server recorded in {state_dir / 'server.json'}", 2)


def _client(url: str | None, token: str | None, state_dir: Path, retry_for_s: float = _QUICK_RETRY_S,
            client_token: str | None = None) -> SwarmClient:
    """A client with the control token (``token``, else the state dir's file); with ``client_token``
    (or, without it and without ``token``, the state dir's ``client_token`` file) claims use that."""
    client_file = None if client_token or token else state_dir / "client_token"
    try:
        return SwarmClient(_server_url(url, state_dir), token=token, token_file=state_dir / "token",
                           client_token=client_token, client_token_file=client_file, retry_for_s=retry_for_s)
    except ValueError as exc:
        _fail(str(exc), 2)


def _print_json(model: Any) -> None:
    if isinstance(model, list):
        out.print_json(json.dumps([m.model_dump(mode="json") for m in model]))
    else:
        out.print_json(model.model_dump_json())


# --------------------------------------------------------------------------- serve


@app.command()
def serve(
    model: Annotated[str | None, typer.Option(help=(
        "a preset built offline (tiny, tiny-bpe, tiny-bpe-think) or a local Hugging Face model folder "
        "(default: the --config file's `model`, else tiny)"), show_default=False)] = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    config: Annotated[list[Path] | None, typer.Option(
        help="TOML file of flat ServerConfig keys (repeatable with --check only)")] = None,
    token: Annotated[str | None, typer.Option(
        envvar="SWARM_TOKEN", show_envvar=True,
        help="control token (else <state-dir>/token, else generated there on loopback); "
             "tools: set $SWARM_TOKEN, never argv")] = None,
    seed: int = 0,
    mlflow_uri: Annotated[str | None, typer.Option(envvar="MLFLOW_TRACKING_URI", show_envvar=True, help=(
        "log this server's config, per-step metrics, checkpoints and end status to one MLflow run"))] = None,
    mlflow_run_id: Annotated[str | None, typer.Option(help="log into this existing MLflow run")] = None,
    mlflow_experiment: Annotated[str, typer.Option(help="MLflow experiment of a new run")] = "swarm",
    engine: Annotated[str | None, typer.Option(help="generator: torch (default, in process) or vllm")] = None,
    trainer: Annotated[str | None, typer.Option(help="trainer: torch (default, in process) or verl (Ray, FSDP2)")] = None,
    backend: Annotated[str | None, typer.Option(help="alias: sets --engine and --trainer to the same name")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="verl trainer: FSDP2 workers (default 1)")] = None,
    ray_address: Annotated[str | None, typer.Option(help="verl trainer: an existing Ray cluster")] = None,
    vllm_url: Annotated[str | None, typer.Option(help="vllm engine: attach to a running vLLM server")] = None,
    vllm_python: Annotated[str | None, typer.Option(envvar="SWARM_VLLM_PYTHON", show_envvar=True,
                                                    help="vllm engine: Python of the vLLM environment")] = None,
    weight_transfer: Annotated[str | None, typer.Option(
        help="vllm engine: auto (default: nccl only where it can work, else disk), disk or nccl")] = None,
    generator_gpus: Annotated[str | None, typer.Option(help="GPUs reserved for the vLLM child, e.g. 3 or 2,3")] = None,
    trainer_gpus: Annotated[str | None, typer.Option(help="GPUs for verl's Ray workers, e.g. 0,1,2")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(
        help="vllm engine: share of each GPU vLLM takes (default 0.9; 0.4 on a GPU shared with the trainer)")] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch CPU threads (default: 1 for the tiny preset, torch's default otherwise)")] = None,
    max_context: Annotated[int | None, typer.Option(help="override the model's context length")] = None,
    tool_call_parser: Annotated[str | None, typer.Option(help=(
        "how replies become message.tool_calls (vLLM's names): hermes, llama3_json, none, or auto "
        "(by the chat template; the default); config key tool_call_parser"))] = None,
    reasoning_parser: Annotated[str | None, typer.Option(help=(
        "qwen3 or deepseek_r1: <think> text goes to message.reasoning_content; config key reasoning_parser"))] = None,
    max_steps: Annotated[int | None, typer.Option(min=0, help=(
        "train no step past this one (episodes are still served); config key max_steps"))] = None,
    check: Annotated[bool, typer.Option("--check", help=(
        "only validate each --config file with these flags as serve would: print '<file>: ok' or "
        "'<file>: invalid server settings: <why>' per file, exit 0 when all are valid, else 2; loads no model"))] = False,
) -> None:
    """Host and train one model: OpenAI-compatible chat, episodes, GRPO steps, control API.

    The client token (claims only) is ``$SWARM_CLIENT_TOKEN``, else ``<state-dir>/client_token``,
    else generated there."""
    from pydantic import ValidationError

    from swarm.server.auth import private_dir
    from swarm.server.settings import ServerConfig, ServerSettings, engine_choice

    def settings_for(path: Path | None) -> ServerSettings:
        server_config = ServerConfig.from_toml(path) if path is not None else ServerConfig()
        parsers = {"tool_call_parser": tool_call_parser, "reasoning_parser": reasoning_parser, "max_steps": max_steps}
        if any(v is not None for v in parsers.values()):  # flags override the file
            server_config = server_config.patched({k: v for k, v in parsers.items() if v is not None})
        chosen = engine_choice(path) if path is not None else {}  # flags override the file
        if backend is not None:
            chosen.update(engine=backend, trainer=backend)
        flags = {"engine": engine, "trainer": trainer, "workers": workers, "ray_address": ray_address,
                 "weight_transfer": weight_transfer, "generator_gpus": generator_gpus, "trainer_gpus": trainer_gpus,
                 "gpu_memory_utilization": gpu_memory_utilization}
        chosen.update({k: v for k, v in flags.items() if v is not None})
        if model is not None:
            chosen["model"] = model
        client_token = os.environ.get("SWARM_CLIENT_TOKEN") or None  # env only: argv is visible to all
        return ServerSettings(host=host, port=port, state_dir=state_dir, token=token,
                              client_token=client_token, seed=seed, mlflow_uri=mlflow_uri,
                              mlflow_run_id=mlflow_run_id, mlflow_experiment=mlflow_experiment,
                              max_context=max_context,
                              vllm_url=vllm_url, vllm_python=vllm_python, config=server_config, **chosen)

    files: list[Path | None] = list(config or []) or [None]
    if check:
        # The researcher checks every experiment's config of a plan in one call, before any run starts.
        invalid = 0
        for path in files:
            try:
                settings_for(path)
                line = "ok"
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                invalid += 1
                line = f"invalid server settings: {_one_line(exc)}"
            out.print(f"{path or '(no --config)'}: {line}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2 if invalid else 0)
    if len(files) > 1:
        _fail("one --config per server (several only with --check)", 2)
    try:
        settings = settings_for(files[0])
    except (ValueError, ValidationError) as exc:
        _fail(f"invalid server settings: {exc}", 2)
    try:
        private_dir(state_dir)  # holds the secret and the tokens: owner only
    except OSError as exc:
        _fail(f"cannot create the state dir {state_dir}: {exc}", 2)
    from swarm.backends.torch.presets import is_preset

    if threads is None and is_preset(settings.model):
        # The tiny model's ops are too small to gain from intra-op threads, and on a busy machine
        # two threads per op made training steps 5x slower than one (measured, see the letters README).
        threads = 1
    if threads is not None:
        import torch  # only to size the CPU thread pool; the backend owns everything else

        torch.set_num_threads(threads)
    from swarm.server.serve import serve as run_server

    try:
        run_server(settings)
    except ValueError as exc:
        _fail(str(exc), 2)


def _one_line(exc: ValueError) -> str:
    """A validation error as one line (pydantic's own text spans several)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in errors())
    return " ".join(str(exc).split())


# --------------------------------------------------------------------------- run


@app.command()
def run(
    client_file: Annotated[Path | None, typer.Argument(
        metavar="[CLIENT.py]", help="a study client module (or --data FILE instead)", show_default=False)] = None,
    server: Annotated[str | None, typer.Option(help="server URL (default: <state-dir>/server.json)")] = None,
    episodes: Annotated[int | None, typer.Option(min=1, help="stop after this many episodes")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="parallel episodes (default: the study's)")] = None,
    group_size: Annotated[int | None, typer.Option(min=1, help="episodes per task (default: the study's)")] = None,
    seed: Annotated[int, typer.Option(help="passed to the study's tasks(seed)")] = 0,
    eval_every: Annotated[int | None, typer.Option(
        min=0, help="evaluate the study's heldout() tasks every N steps (default: its EVAL_EVERY, else 5; 0: off)",
        show_default=False)] = None,
    token: Annotated[str | None, typer.Option(
        envvar="SWARM_TOKEN", show_envvar=True,
        help="token (after $SWARM_CLIENT_TOKEN; else <state-dir>/client_token, else <state-dir>/token)")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    retry_for: Annotated[float, typer.Option(help="seconds to keep retrying an unreachable server")] = 120.0,
    rewards_out: Annotated[Path | None, typer.Option(
        help="write one JSON line per episode (task_id, group, purpose, reward) to this file")] = None,
    probe: Annotated[bool, typer.Option(
        "--probe", help="check tasks(seed) and heldout() without a server (deterministic per seed, seeds differ, "
                        "held-out set disjoint); print one JSON line, exit 1 on a problem")] = False,
    data: Annotated[Path | None, typer.Option(
        help="train on a data file instead of CLIENT.py: jsonl or parquet, verl's RL rows (prompt messages, "
             "data_source, reward_model.ground_truth, extra_info) or {prompt, answer} rows", rich_help_panel="Data")] = None,
    reward: Annotated[str, typer.Option(
        help="verl (verl's default_compute_score by data_source), exact, a verl data_source name, or PATH:FUNC "
             "(FUNC(text, row) -> float)", rich_help_panel="Data")] = "verl",
    heldout: Annotated[Path | None, typer.Option(help="held-out file, evaluated and never trained",
                                                 rich_help_panel="Data")] = None,
    heldout_fraction: Annotated[float | None, typer.Option(
        help="hold out this fraction of --data by a stable hash of each row", rich_help_panel="Data")] = None,
    heldout_size: Annotated[int, typer.Option(
        min=0, help="evaluate at most this many held-out rows (0: all)", rich_help_panel="Data")] = 64,
    epochs: Annotated[int, typer.Option(min=1, help="passes over --data, each shuffled by --seed",
                                        rich_help_panel="Data")] = 1,
    workflow: Annotated[str | None, typer.Option(
        help="PATH:FUNC, your agent FUNC(ep, task) -> final text (scored by --reward) or reward",
        rich_help_panel="Data")] = None,
    warmup_steps: Annotated[int, typer.Option(
        min=0, help="supervised warm-up on the rows' answers (answer or extra_info.answer) on a fresh server",
        rich_help_panel="Data")] = 0,
    warmup_lr: Annotated[float, typer.Option(help="learning rate of the warm-up", rich_help_panel="Data")] = 3e-3,
) -> None:
    """Run a study client (tasks + workflow + reward) against a server until tasks or --episodes run out.

    Claims use the client token: ``$SWARM_CLIENT_TOKEN``, else ``--token``, else
    ``<state-dir>/client_token``, else the control token."""
    if (client_file is None) == (data is None):
        _fail("give a study CLIENT.py or --data FILE (one of them)", 2)
    if data is not None:
        module: Any = _data_study(data, reward, heldout, heldout_fraction, heldout_size, epochs, workflow,
                                  warmup_steps, warmup_lr, group_size, concurrency)
        if probe:
            _fail("--probe checks a CLIENT.py; --data is checked every time it loads", 2)
    elif probe:
        report = probe_study(client_file)
        typer.echo(report.model_dump_json())
        raise typer.Exit(0 if report.ok else 1)
    else:
        try:
            module = load_study(client_file)
        except ValueError as exc:
            _fail(str(exc), 2)
        except Exception as exc:  # the study's own import failed: show it plainly, it is the user's code
            log.exception("importing %s failed", client_file)
            _fail(f"cannot import {client_file}: {type(exc).__name__}: {exc}", 2)
    client_token = os.environ.get("SWARM_CLIENT_TOKEN") or token
    stop_on_sigterm()
    with _client(server, token, state_dir, retry_for_s=retry_for, client_token=client_token) as client:
        try:
            summary = run_study(module, client, seed=seed, episodes=episodes, concurrency=concurrency,
                                group_size=group_size, progress=True, eval_every=eval_every, rewards_out=rewards_out)
        except SwarmError as exc:
            _fail(str(exc))
        except ValueError as exc:
            _fail(str(exc), 2)
        except KeyboardInterrupt:
            _fail("interrupted; the episodes in flight were finished or aborted", 130)
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    out.print(f"finished={summary.finished} aborted={summary.aborted} mean_reward={mean} "
              f"seconds={summary.seconds:.1f} policy_version={summary.policy_version}", highlight=False)


def _data_study(data: Path, reward: str, heldout: Path | None, heldout_fraction: float | None, heldout_size: int,
                epochs: int, workflow: str | None, warmup_steps: int, warmup_lr: float, group_size: int | None,
                concurrency: int | None) -> Any:
    """The data file as a study (``swarm.data``, imported here only: parquet and verl are heavy);
    a bad file or reward stops here, before the server is contacted."""
    from swarm.data import DataOptions, build_study

    options = DataOptions(data=data, reward=reward, heldout=heldout, heldout_fraction=heldout_fraction,
                          heldout_size=heldout_size, epochs=epochs, workflow=workflow, warmup_steps=warmup_steps,
                          warmup_lr=warmup_lr, group_size=group_size or 8, concurrency=concurrency or 16)
    try:
        study = build_study(options)
    except ValueError as exc:  # DataError is a ValueError: file, row and reason
        _fail(str(exc), 2)
    log.info("data %s: %d training rows, %d held-out rows, reward %s", data, len(study.train), len(study.held), reward)
    return study


# --------------------------------------------------------------------------- observe


@app.command()
def status(url: Url = None, json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """The server's state, policy version, step, episode counts and throughput."""
    with _client(url, token, state_dir) as client:
        try:
            result = client.status()
        except SwarmError as exc:
            _fail(str(exc))
    if json_:
        _print_json(result)
        return
    table = Table(title=f"swarm server {client.url}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("state", result.state.value)
    table.add_row("model", result.model)
    table.add_row("policy version", str(result.policy_version))
    table.add_row("step", str(result.step))
    table.add_row("episodes", "  ".join(f"{k}={v}" for k, v in result.episodes.model_dump().items()))
    table.add_row("groups pending", str(result.groups_pending))
    table.add_row("clients", str(result.clients))
    table.add_row("config version", str(result.config_version))
    for key, value in sorted(result.throughput.items()):
        table.add_row(key, f"{value:.4g}")
    table.add_row("uptime", f"{result.uptime_s:.0f} s")
    out.print(table)


@app.command()
def metrics(url: Url = None, since: Annotated[int, typer.Option(help="first step to show")] = 0,
            keys: Annotated[str | None, typer.Option(help="comma-separated metric keys to show")] = None,
            json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Per-step training metrics (slash-named keys such as train/reward_mean)."""
    with _client(url, token, state_dir) as client:
        try:
            steps = client.metrics(since_step=since)
        except SwarmError as exc:
            _fail(str(exc))
    if json_:
        _print_json(steps)
        return
    available = sorted({k for s in steps for k in s.metrics})
    if keys:
        shown = [k.strip() for k in keys.split(",") if k.strip()]
    else:
        first = [k for k in ("train/reward_mean", "train/loss") if k in available]
        shown = first + [k for k in available if k not in first][: max(0, 6 - len(first))]
    table = Table(title=f"metrics since step {since}")
    for column in ("step", "version", *shown):
        table.add_column(column, justify="right", overflow="fold")  # long slash keys wrap, not truncate
    for s in steps:
        cells = [f"{s.metrics[k]:.4g}" if k in s.metrics else "-" for k in shown]
        table.add_row(str(s.step), str(s.policy_version), *cells)
    out.print(table)
    if not keys and len(available) > len(shown):
        err.print(f"{len(available) - len(shown)} more keys; pick with --keys (available: {', '.join(available)})")


@app.command()
def plan(url: Url = None,
         staleness: Annotated[int | None, typer.Option(help="plan for this max_staleness (default: the server's)")] = None,
         target_busy: Annotated[float, typer.Option(help="learner utilisation to reach, in (0, 1)")] = 0.9,
         json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """How many clients, at what concurrency, keep the learner busy (ECHO-2's provisioning rule on
    the server's live figures: perf/learner_busy, perf/rollout_eps_per_client, step and sync times)."""
    from swarm.plan import NotEnoughData, advise, describe, measure

    with _client(url, token, state_dir) as client:
        try:
            status, config, steps = client.status(), client.config().values, client.metrics()
        except SwarmError as exc:
            _fail(str(exc))
    try:
        figures = measure(steps, clients=status.clients, in_flight=int(status.throughput.get("in_flight", 0)))
        advice = advise(figures, mode=config["mode"], target_busy=target_busy,
                        staleness=config["max_staleness"] if staleness is None else staleness)
    except (NotEnoughData, ValueError) as exc:
        _fail(str(exc), code=2)
    if json_:
        print(json.dumps(advice.as_dict(), indent=2))
        return
    for line in describe(advice):
        out.print(line)


@app.command()
def events(url: Url = None,
           last_event_id: Annotated[int | None, typer.Option(help="resume after this event id")] = None,
           json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print the server's live event stream (episode.*, step.*, weights.*, config.*) until Ctrl-C."""
    with _client(url, token, state_dir, retry_for_s=30.0) as client:
        try:
            for event in client.events(last_event_id=last_event_id):
                if json_:
                    print(event.model_dump_json(), flush=True)
                else:
                    out.print(f"[dim]{event.id:>6}[/dim] [bold]{event.type:<18}[/bold] "
                              f"{json.dumps(event.data, separators=(',', ':'))}", highlight=False)
        except KeyboardInterrupt:
            return
        except SwarmError as exc:
            _fail(str(exc))


# --------------------------------------------------------------------------- steer


@app.command()
def config(url: Url = None,
           pairs: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...",
                                                             help="values to change (JSON where possible)")] = None,
           json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show the live config, or change keys: `swarm config URL lr=3e-4 temperature=0.8`."""
    if url and "=" in url and not url.startswith(("http://", "https://")):
        pairs, url = [url, *(pairs or [])], None  # `swarm config lr=1e-4` with the URL from server.json
    values = _parse_pairs(pairs or [])
    with _client(url, token, state_dir) as client:
        try:
            view = client.patch_config(**values) if values else client.config()
        except SwarmError as exc:
            _fail(str(exc))
    if json_:
        _print_json(view)
        return
    table = Table(title=f"config version {view.version}")
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in sorted(view.values.items()):
        style = "green" if key in values else None
        table.add_row(key, json.dumps(value), style=style)
    out.print(table)


def _parse_pairs(pairs: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            _fail(f"expected KEY=VALUE, got {pair!r}", 2)
        try:
            values[key.strip()] = json.loads(raw)
        except ValueError:
            values[key.strip()] = raw  # a bare word (grpo, sync) is a string
    return values


def _control(action: str, url: str | None, token: str | None, state_dir: Path) -> None:
    with _client(url, token, state_dir) as client:
        try:
            result = client.control(action)
        except SwarmError as exc:
            _fail(str(exc))
    detail = f" {json.dumps(result.detail)}" if result.detail else ""
    out.print(f"{result.action.value}: server is {result.state.value}{detail}", highlight=False)


@app.command()
def pause(url: Url = None, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop handing out episodes and training (in-flight episodes may finish)."""
    _control("pause", url, token, state_dir)


@app.command()
def resume(url: Url = None, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Resume after pause."""
    _control("resume", url, token, state_dir)


@app.command()
def checkpoint(url: Url = None, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Write a checkpoint now."""
    _control("checkpoint", url, token, state_dir)


@app.command()
def stop(url: Url = None, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Checkpoint and shut the server down."""
    _control("stop", url, token, state_dir)


def main() -> None:
    app(prog_name="swarm")


if __name__ == "__main__":
    sys.exit(main())
