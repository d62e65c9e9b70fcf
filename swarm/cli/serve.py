"""``swarm serve``: host and train one model (heavy imports happen here only, when it runs).

The options are gathered into one ``ServeFlags`` of typed groups, each a ``--help`` panel (Model,
Engines, vLLM and verl, Training, Server, MLflow, Logging); ``--check`` validates config files without
loading a model (the researcher checks a plan's configs in one call before any run starts).
``--log-file`` sends the log to a size-capped, rotated file (a server left running for days must not
fill its disk with log lines either); stderr then keeps warnings and errors only.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar

import typer
from rich.markup import escape

from swarm import stopping
from swarm.cli._common import DEFAULT_STATE_DIR, STATE_DIR_HELP, app, fail, fetch_model, grouped, out
from swarm.config import describe_keys

if TYPE_CHECKING:
    from swarm.config import ServerSettings


@dataclass(frozen=True)
class ModelFlags:
    """What is served: the model, its context, the names it answers to and how its replies are read."""

    PANEL: ClassVar[str] = "Model"
    model: str | None
    max_context: int | None
    served_model_name: str | None
    tool_call_parser: str | None
    reasoning_parser: str | None


@dataclass(frozen=True)
class EngineFlags:
    """Which engine generates (``--engine``) and which trainer trains, and the in-process torch knobs."""

    PANEL: ClassVar[str] = "Engines"
    engine: str | None
    trainer: str | None
    backend: str | None
    local_generator: bool
    device: str | None
    dtype: str | None
    decode_cache: str | None
    threads: int | None


@dataclass(frozen=True)
class ExternalFlags:
    """The vLLM engine's and the verl trainer's own options, and the GPUs each gets."""

    PANEL: ClassVar[str] = "vLLM and verl"
    workers: int | None
    ray_address: str | None
    vllm_url: str | None
    vllm_python: str | None
    weight_transfer: str | None
    generator_gpus: str | None
    trainer_gpus: str | None
    gpu_memory_utilization: float | None


@dataclass(frozen=True)
class TrainingFlags:
    """What training starts from: the config files, the seed, the sampling-noise modes and the last step."""

    PANEL: ClassVar[str] = "Training"
    config: list[Path] | None
    seed: int
    deterministic: bool | None
    coupled: bool | None
    max_steps: int | None
    check: bool


@dataclass(frozen=True)
class ServerFlags:
    """Where the server listens and keeps its state, and who may control it."""

    PANEL: ClassVar[str] = "Server"
    host: str
    port: int
    state_dir: Path
    token: str | None
    disk_reserve_mb: float | None


@dataclass(frozen=True)
class TrackingFlags:
    """The server's own MLflow run."""

    PANEL: ClassVar[str] = "MLflow"
    mlflow_uri: str | None
    mlflow_run_id: str | None
    mlflow_experiment: str


@dataclass(frozen=True)
class LogFlags:
    """Where the log goes, and how much of it is kept."""

    PANEL: ClassVar[str] = "Logging"
    log_file: Path | None
    log_max_mb: float
    log_keep: int


@dataclass(frozen=True)
class ServeFlags:
    """``swarm serve``'s options, one typed group a ``--help`` panel (see its signature for their help)."""

    served: ModelFlags
    engines: EngineFlags
    external: ExternalFlags
    training: TrainingFlags
    server: ServerFlags
    tracking: TrackingFlags
    logging: LogFlags


_MODEL, _ENGINES, _EXTERNAL = ModelFlags.PANEL, EngineFlags.PANEL, ExternalFlags.PANEL
_TRAINING, _SERVER, _TRACKING, _LOGGING = TrainingFlags.PANEL, ServerFlags.PANEL, TrackingFlags.PANEL, LogFlags.PANEL


@app.command(epilog="Config keys (--config FILE: flat, or in these tables; live: swarm config URL KEY=VALUE):\n\n"
                     + escape(describe_keys()))  # escaped: rich reads "[batching]" as markup
def serve(
    # Model
    model: Annotated[str | None, typer.Option(help=(
        "a preset built offline (tiny, tiny-bpe, tiny-bpe-think), a registry model (smollm2-135m), a .gguf file, "
        "a local Hugging Face model folder or a Hugging Face Hub name, org/name or org/name@revision (downloaded into "
        "the hub cache; offline, found there) (default: the --config file's `model`, else tiny); a pretrained model's "
        "lr, max_tokens, max_staleness and micro_batch_tokens default to values scaled to its size"),
        show_default=False, rich_help_panel=_MODEL)] = None,
    max_context: Annotated[int | None, typer.Option(help="override the model's context length",
                                                    rich_help_panel=_MODEL)] = None,
    served_model_name: Annotated[str | None, typer.Option(help=(
        "NAME[,NAME...]: the model names the OpenAI routes answer to (vLLM's flag), e.g. gpt-4o-mini for clients "
        "that check names; /v1/models lists them, a request naming another model gets 404 (default: the model's "
        "own name is listed and any name is served)"), show_default=False, rich_help_panel=_MODEL)] = None,
    tool_call_parser: Annotated[str | None, typer.Option(help=(
        "how replies become message.tool_calls (vLLM's names): hermes, llama3_json, none, or auto "
        "(by the chat template; the default); config key tool_call_parser"), rich_help_panel=_MODEL)] = None,
    reasoning_parser: Annotated[str | None, typer.Option(help=(
        "qwen3 or deepseek_r1: <think> text goes to message.reasoning_content; config key reasoning_parser"),
        rich_help_panel=_MODEL)] = None,
    # Engines
    engine: Annotated[str | None, typer.Option(help="generator: torch (default, in process) or vllm",
                                               rich_help_panel=_ENGINES)] = None,
    trainer: Annotated[str | None, typer.Option(help="trainer: torch (default, in process) or verl (Ray, FSDP2)",
                                                rich_help_panel=_ENGINES)] = None,
    backend: Annotated[str | None, typer.Option(help="alias: sets --engine and --trainer to the same name",
                                                rich_help_panel=_ENGINES)] = None,
    local_generator: Annotated[bool, typer.Option(help=(
        "the server's own generator serves chat calls beside any `swarm worker` that joins; "
        "--no-local-generator: only workers do (chat calls get 503 until one is ready)"),
        rich_help_panel=_ENGINES)] = True,
    device: Annotated[str | None, typer.Option(help=(
        "torch engine: auto (default: the first GPU no vLLM child or verl worker was given, else cpu), cpu, cuda, "
        "cuda:N"), rich_help_panel=_ENGINES)] = None,
    dtype: Annotated[str | None, typer.Option(help=(
        "torch engine: auto (default: bfloat16 on a GPU with fp32 master weights, float32 on the CPU), float32, "
        "bfloat16"), rich_help_panel=_ENGINES)] = None,
    decode_cache: Annotated[str | None, typer.Option(help=(
        "torch engine: auto (default: static on a GPU, else dynamic), static (slots + CUDA graphs), dynamic, "
        "compiled (static, the step fused by torch.compile; opt-in)"), rich_help_panel=_ENGINES)] = None,
    threads: Annotated[int | None, typer.Option(
        min=1, help="torch CPU threads (default: 1 for the tiny preset, torch's default otherwise)",
        rich_help_panel=_ENGINES)] = None,
    # vLLM and verl
    vllm_url: Annotated[str | None, typer.Option(help="vllm engine: attach to a running vLLM server",
                                                 rich_help_panel=_EXTERNAL)] = None,
    vllm_python: Annotated[str | None, typer.Option(envvar="SWARM_VLLM_PYTHON", show_envvar=True,
                                                    help="vllm engine: Python of the vLLM environment",
                                                    rich_help_panel=_EXTERNAL)] = None,
    weight_transfer: Annotated[str | None, typer.Option(
        help="vllm engine: auto (default: nccl only where it can work, else disk), disk or nccl",
        rich_help_panel=_EXTERNAL)] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(
        help="vllm engine: share of each GPU vLLM takes (default 0.9; 0.4 on a GPU shared with the trainer)",
        rich_help_panel=_EXTERNAL)] = None,
    generator_gpus: Annotated[str | None, typer.Option(help="GPUs reserved for the vLLM child, e.g. 3 or 2,3",
                                                       rich_help_panel=_EXTERNAL)] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="verl trainer: FSDP2 workers (default 1)",
                                                rich_help_panel=_EXTERNAL)] = None,
    ray_address: Annotated[str | None, typer.Option(help="verl trainer: an existing Ray cluster",
                                                    rich_help_panel=_EXTERNAL)] = None,
    trainer_gpus: Annotated[str | None, typer.Option(help="GPUs for verl's Ray workers, e.g. 0,1,2",
                                                     rich_help_panel=_EXTERNAL)] = None,
    # Training
    config: Annotated[list[Path] | None, typer.Option(
        help="TOML file of config keys, flat or in tables by section (listed below; repeatable with --check only)",
        rich_help_panel=_TRAINING)] = None,
    seed: Annotated[int, typer.Option(rich_help_panel=_TRAINING)] = 0,
    deterministic: Annotated[bool | None, typer.Option("--deterministic", help=(
        "reproducible runs in sync mode: the same seed and config give the same tokens, rewards and step metrics "
        "whatever the clients' concurrency (counter-based sampling noise, batch-invariant decoding, one batch "
        "admitted per policy version); torch engine only; config key deterministic"), show_default=False,
        rich_help_panel=_TRAINING)] = None,
    coupled: Annotated[bool | None, typer.Option("--coupled", help=(
        "paired runs of the same seed share their sampling noise (common random numbers for comparing arms): "
        "--deterministic's keyed noise and step order, with batched decoding and the config's admission (the "
        "default's speed; runs are not bit for bit); torch engine only; config key coupled"), show_default=False,
        rich_help_panel=_TRAINING)] = None,
    max_steps: Annotated[int | None, typer.Option(min=0, help=(
        "train no step past this one (episodes are still served); config key max_steps"),
        rich_help_panel=_TRAINING)] = None,
    check: Annotated[bool, typer.Option("--check", help=(
        "only validate each --config file with these flags as serve would: print '<file>: ok' or "
        "'<file>: invalid server settings: <why>' per file, exit 0 when all are valid, else 2; loads no model"),
        rich_help_panel=_TRAINING)] = False,
    # Server
    host: Annotated[str, typer.Option(rich_help_panel=_SERVER)] = "127.0.0.1",
    port: Annotated[int, typer.Option(rich_help_panel=_SERVER)] = 8000,
    state_dir: Annotated[Path, typer.Option(help=STATE_DIR_HELP, rich_help_panel=_SERVER)] = DEFAULT_STATE_DIR,
    token: Annotated[str | None, typer.Option(
        envvar="SWARM_TOKEN", show_envvar=True,
        help="control token (else <state-dir>/token, else generated there on loopback); "
             "tools: set $SWARM_TOKEN, never argv", rich_help_panel=_SERVER)] = None,
    disk_reserve_mb: Annotated[float | None, typer.Option(min=0, help=(
        "free space (MiB) kept under the state dir for running episodes: below it new claims answer 507 "
        "(disk full) (default 64)"), rich_help_panel=_SERVER)] = None,
    # MLflow
    mlflow_uri: Annotated[str | None, typer.Option(envvar="MLFLOW_TRACKING_URI", show_envvar=True, help=(
        "log this server's config, per-step metrics, checkpoints and end status to one MLflow run"),
        rich_help_panel=_TRACKING)] = None,
    mlflow_run_id: Annotated[str | None, typer.Option(help="log into this existing MLflow run",
                                                      rich_help_panel=_TRACKING)] = None,
    mlflow_experiment: Annotated[str, typer.Option(help="MLflow experiment of a new run",
                                                   rich_help_panel=_TRACKING)] = "swarm",
    # Logging
    log_file: Annotated[Path | None, typer.Option(help=(
        "write the log to this file, rotated at --log-max-mb and keeping --log-keep older files (so at most "
        "(keep + 1) x max-mb on disk); stderr then shows warnings and errors only"), rich_help_panel=_LOGGING)] = None,
    log_max_mb: Annotated[float, typer.Option(min=0.01, help="--log-file: rotate past this many MiB",
                                              rich_help_panel=_LOGGING)] = 64.0,
    log_keep: Annotated[int, typer.Option(min=1, help="--log-file: rotated older files kept",
                                          rich_help_panel=_LOGGING)] = 2,
) -> None:
    """Host and train one model: OpenAI-compatible chat, episodes, GRPO steps, control API.

    The client token (claims only) is ``$SWARM_CLIENT_TOKEN``, else ``<state-dir>/client_token``,
    else generated there; the worker token (``swarm worker`` processes only) likewise
    ``$SWARM_WORKER_TOKEN``, else ``<state-dir>/worker_token``."""
    flags = grouped(ServeFlags, locals())  # every option above, by name (nothing else is defined yet)
    logs = flags.logging
    if logs.log_file is not None and not flags.training.check:
        log_to_file(logs.log_file, max_bytes=int(logs.log_max_mb * 2**20), keep=logs.log_keep)
    _check_or_serve(flags)


def log_to_file(path: Path, *, max_bytes: int, keep: int) -> None:
    """The root logger writes to ``path`` through a ``RotatingFileHandler`` (``keep`` older files,
    ``path.1`` ...); the stderr handler the CLI set up stays, for warnings and errors only."""
    from logging.handlers import RotatingFileHandler

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # keep >= 1: with backupCount=0 the handler reopens the full file in append mode, never capping it.
        handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=keep, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot open the log file {path}: {exc}", 2)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)-8s %(name)s: %(message)s"))
    root = logging.getLogger()
    for existing in root.handlers:
        existing.setLevel(logging.WARNING)
    root.addHandler(handler)
    sys.stderr.flush()


def _check_or_serve(flags: ServeFlags) -> None:
    """``--check`` every --config file, or serve with the one given (none: the defaults)."""
    files: list[Path | None] = list(flags.training.config or []) or [None]
    if flags.training.check:
        _check(flags, files)
    if len(files) > 1:
        fail("one --config per server (several only with --check)", 2)
    _serve(flags, files[0])


def settings_for(flags: ServeFlags, path: Path | None) -> ServerSettings:
    """The server's settings: the config file (if any), then the flags over it; the keys neither sets
    take the model's defaults (``swarm.config.starting_config``)."""
    from swarm.config import ServerSettings, read_config_file, starting_config

    file = read_config_file(path) if path is not None else None
    chosen = dict(file.engine) if file is not None else {}  # flags override the file
    served, engines, external, training = flags.served, flags.engines, flags.external, flags.training
    if engines.backend is not None:
        chosen.update(engine=engines.backend, trainer=engines.backend)
    named = {"model": served.model, "engine": engines.engine, "trainer": engines.trainer, "device": engines.device,
             "dtype": engines.dtype, "decode_cache": engines.decode_cache, "workers": external.workers,
             "ray_address": external.ray_address, "weight_transfer": external.weight_transfer,
             "generator_gpus": external.generator_gpus, "trainer_gpus": external.trainer_gpus,
             "gpu_memory_utilization": external.gpu_memory_utilization, "deterministic": training.deterministic,
             "coupled": training.coupled}
    chosen.update({k: v for k, v in named.items() if v is not None})
    live_keys = {"tool_call_parser": served.tool_call_parser, "reasoning_parser": served.reasoning_parser,
                 "max_steps": training.max_steps}
    given = {**(file.values if file is not None else {}), **{k: v for k, v in live_keys.items() if v is not None}}
    model = str(chosen.get("model") or ServerSettings.model_fields["model"].default)
    server_config, defaults = starting_config(model, given)
    client_token = os.environ.get("SWARM_CLIENT_TOKEN") or None  # env only: argv is visible to all
    worker_token = os.environ.get("SWARM_WORKER_TOKEN") or None
    server, tracking = flags.server, flags.tracking
    return ServerSettings(host=server.host, port=server.port, state_dir=server.state_dir, token=server.token,
                          client_token=client_token, worker_token=worker_token,
                          local_generator=engines.local_generator, seed=training.seed, mlflow_uri=tracking.mlflow_uri,
                          mlflow_run_id=tracking.mlflow_run_id, mlflow_experiment=tracking.mlflow_experiment,
                          max_context=served.max_context, vllm_url=external.vllm_url,
                          vllm_python=external.vllm_python, served_model_name=_names(served.served_model_name),
                          config=server_config, defaults=defaults, **chosen,
                          **({} if server.disk_reserve_mb is None else {"disk_reserve_mb": server.disk_reserve_mb}))


def _names(value: str | None) -> list[str] | None:
    """``--served-model-name a,b`` as a list (vLLM also takes several); None when not given."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise ValueError("--served-model-name: give at least one name")
    return names


def _check(flags: ServeFlags, files: list[Path | None]) -> None:
    """``--check``: one line a file, exit 0 when all are valid, else 2."""
    invalid = 0
    for path in files:
        try:
            settings_for(flags, path)
            line = "ok"
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            invalid += 1
            line = f"invalid server settings: {_one_line(exc)}"
        out.print(f"{path or '(no --config)'}: {line}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2 if invalid else 0)


def _serve(flags: ServeFlags, path: Path | None) -> None:
    """Build the settings, prepare the state dir and the torch threads, and serve until stopped."""
    from pydantic import ValidationError

    from swarm.server.auth import private_dir

    try:
        settings = settings_for(flags, path)
    except (ValueError, ValidationError) as exc:
        fail(f"invalid server settings: {exc}", 2)
    pinned = fetch_model(settings.model)  # a Hub name: downloaded or found cached, else exit 2 before any load
    if pinned != settings.model:  # the generator and trainer load this snapshot; the defaults scale to its size
        settings = settings_for(replace(flags, served=replace(flags.served, model=pinned)), path)
    try:
        private_dir(flags.server.state_dir)  # holds the secret and the tokens: owner only
    except OSError as exc:
        fail(f"cannot create the state dir {flags.server.state_dir}: {exc}", 2)
    from swarm.models.presets import is_preset

    threads = flags.engines.threads
    if threads is None and is_preset(settings.model):
        # The tiny model's ops are too small to gain from intra-op threads, and on a busy machine
        # two threads per op made training steps 5x slower than one (measured, see the letters README).
        threads = 1
    if threads is not None:
        import torch  # only to size the CPU thread pool; the backend owns everything else

        torch.set_num_threads(threads)
    from swarm.server.serve import serve as run_server

    stopping.interrupt_on_sigterm()  # a stop while the model loads; once serving, uvicorn's shutdown
    try:
        run_server(settings)
    except ValueError as exc:
        fail(str(exc), 2)
    except KeyboardInterrupt:
        fail("stopped before the server was ready", 130)


def _one_line(exc: ValueError) -> str:
    """A validation error as one line (pydantic's own text spans several)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in errors())
    return " ".join(str(exc).split())

