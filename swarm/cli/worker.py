"""``swarm worker``: join a running server's generator pool with this machine's engine.

The options are gathered into one ``WorkerFlags`` of typed groups, each a ``--help`` panel (Server,
Engine, Network). Heavy imports (torch, the worker's HTTP app) happen when it runs. The worker token is ``--token``,
else ``$SWARM_WORKER_TOKEN``, else the server's ``<state-dir>/worker_token`` when the state dir is at
hand (a worker on the server's machine); a wrong one is refused by the server (nothing registered).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer

from swarm import stopping
from swarm.cli._common import DEFAULT_STATE_DIR, STATE_DIR_HELP, app, fail, fetch_model, grouped


@dataclass(frozen=True)
class JoinFlags:
    """The server whose pool this worker joins, and its worker token."""

    PANEL: ClassVar[str] = "Server"
    server: str
    token: str | None
    state_dir: Path


@dataclass(frozen=True)
class GenerationFlags:
    """What generates here: the engine (``--engine``), the model and how much it takes on."""

    PANEL: ClassVar[str] = "Engine"
    engine: str
    model: str
    capacity: int
    seed: int
    threads: int | None
    vllm_python: str | None
    work_dir: Path | None
    max_tokens_per_s: float | None


@dataclass(frozen=True)
class NetworkFlags:
    """Where this worker listens, and the URL others reach it at."""

    PANEL: ClassVar[str] = "Network"
    host: str
    port: int
    advertise: str | None


@dataclass(frozen=True)
class WorkerFlags:
    """``swarm worker``'s options, one typed group a ``--help`` panel (see its signature for their help)."""

    join: JoinFlags
    generation: GenerationFlags
    network: NetworkFlags


_SERVER, _ENGINE, _NETWORK = JoinFlags.PANEL, GenerationFlags.PANEL, NetworkFlags.PANEL


@app.command()
def worker(
    # Server
    server: Annotated[str, typer.Option(help="the swarm server's URL, e.g. http://10.0.0.2:8000",
                                        rich_help_panel=_SERVER)],
    token: Annotated[str | None, typer.Option(envvar="SWARM_WORKER_TOKEN", show_envvar=True, help=(
        "the server's worker token (else <state-dir>/worker_token); tools: set $SWARM_WORKER_TOKEN, never argv"),
        rich_help_panel=_SERVER)] = None,
    state_dir: Annotated[Path, typer.Option(help=STATE_DIR_HELP, rich_help_panel=_SERVER)] = DEFAULT_STATE_DIR,
    # Engine
    engine: Annotated[str, typer.Option(help="torch (in process) or vllm (a vLLM child process)",
                                        rich_help_panel=_ENGINE)] = "torch",
    model: Annotated[str, typer.Option(help="the model the server trains: a preset (tiny, tiny-bpe), smollm2-135m, "
                                            "a .gguf file, a local folder or a Hugging Face Hub name (org/name"
                                            " or org/name@revision) of the same architecture (its weights are replaced on "
                                            "join)", rich_help_panel=_ENGINE)] = "tiny",
    capacity: Annotated[int, typer.Option(min=1, max=4096, help="rows it generates at once",
                                          rich_help_panel=_ENGINE)] = 16,
    seed: Annotated[int, typer.Option(rich_help_panel=_ENGINE)] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads (default 1 for presets)",
                                                rich_help_panel=_ENGINE)] = None,
    vllm_python: Annotated[str | None, typer.Option(envvar="SWARM_VLLM_PYTHON", show_envvar=True,
                                                    help="vllm engine: Python of the vLLM environment",
                                                    rich_help_panel=_ENGINE)] = None,
    work_dir: Annotated[Path | None, typer.Option(help="where the engine keeps files (vLLM: weights it reloads); "
                                                      "default: <state-dir>/worker-<port>",
                                                 rich_help_panel=_ENGINE)] = None,
    max_tokens_per_s: Annotated[float | None, typer.Option(min=0.001, help=(
        "cap this worker's generation at this many tokens per second (to emulate slower hardware, e.g. "
        "in benchmarks); default: no cap"), rich_help_panel=_ENGINE)] = None,
    # Network
    host: Annotated[str, typer.Option(help="address to listen on", rich_help_panel=_NETWORK)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on (0: any free one)", rich_help_panel=_NETWORK)] = 0,
    advertise: Annotated[str | None, typer.Option(help=(
        "URL the server and peers reach this worker at (default: http://<host>:<port>); set it behind NAT "
        "or when listening on 0.0.0.0"), rich_help_panel=_NETWORK)] = None,
) -> None:
    """Serve generation for a server's pool: join, load the current weights, then take traffic;
    heartbeat; leave cleanly on SIGTERM (running calls finish)."""
    flags = grouped(WorkerFlags, locals())  # every option above, by name (nothing else is defined yet)
    join, generation, network = flags.join, flags.generation, flags.network
    if generation.engine not in ("torch", "vllm"):
        fail(f"--engine must be torch or vllm, not {generation.engine!r}", 2)
    secret = join.token or _token_file(join.state_dir)
    if not secret:
        fail("no worker token: pass $SWARM_WORKER_TOKEN (the server's <state-dir>/worker_token)", 2)
    model_name = fetch_model(generation.model)  # a Hub name neither cached nor downloadable: exit 2 before any load
    stopping.interrupt_on_sigterm()  # a stop while the engine loads; once serving, the worker's own shutdown
    from swarm.models.presets import is_preset

    if generation.threads is not None or is_preset(model_name):
        import torch

        torch.set_num_threads(generation.threads or 1)
    from swarm.pool.process import run_worker
    from swarm.pool.worker import WorkerOptions

    folder = generation.work_dir or join.state_dir / f"worker-{network.port or os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    generator = _build(generation, model_name, folder)
    options = WorkerOptions(server=join.server, token=secret, engine=generation.engine, capacity=generation.capacity,
                            model=model_name, advertise=network.advertise,
                            max_tokens_per_s=generation.max_tokens_per_s)
    run_worker(options, generator, host=network.host, port=network.port)


def _build(generation: GenerationFlags, model: str, folder: Path) -> Any:
    """The worker's generator; a bad engine or model, or a stop while it loads, ends the command."""
    from swarm.pool.process import build_generator

    try:
        generator, _ = build_generator(generation.engine, model, folder, seed=generation.seed,
                                       capacity=generation.capacity, vllm_python=generation.vllm_python)
    except ValueError as exc:
        fail(f"cannot build the {generation.engine} engine: {exc}", 2)
    except KeyboardInterrupt:
        fail("stopped before the worker was ready", 130)
    return generator


def _token_file(state_dir: Path) -> str | None:
    try:
        return (state_dir / "worker_token").read_text().strip() or None
    except OSError:
        return None
