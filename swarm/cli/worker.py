"""``swarm worker``: join a running server's generator pool with this machine's engine.

Heavy imports (torch, the worker's HTTP app) happen when it runs. The worker token is ``--token``,
else ``$SWARM_WORKER_TOKEN``, else the server's ``<state-dir>/worker_token`` when the state dir is at
hand (a worker on the server's machine); a wrong one is refused by the server (nothing registered).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from swarm import stopping
from swarm.cli._common import DEFAULT_STATE_DIR, StateDir, app, fail, fetch_model


@app.command()
def worker(
    server: Annotated[str, typer.Option(help="the swarm server's URL, e.g. http://10.0.0.2:8000")],
    engine: Annotated[str, typer.Option(help="torch (in process) or vllm (a vLLM child process)")] = "torch",
    model: Annotated[str, typer.Option(help="the model the server trains: a preset (tiny, tiny-bpe), smollm2-135m, "
                                            "a .gguf file, a local folder or a Hugging Face Hub name (org/name"
                                            " or org/name@revision) of the same architecture (its weights are replaced on "
                                            "join)")] = "tiny",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on (0: any free one)")] = 0,
    advertise: Annotated[str | None, typer.Option(help=(
        "URL the server and peers reach this worker at (default: http://<host>:<port>); set it behind NAT "
        "or when listening on 0.0.0.0"))] = None,
    capacity: Annotated[int, typer.Option(min=1, max=4096, help="rows it generates at once")] = 16,
    token: Annotated[str | None, typer.Option(envvar="SWARM_WORKER_TOKEN", show_envvar=True, help=(
        "the server's worker token (else <state-dir>/worker_token); tools: set $SWARM_WORKER_TOKEN, never argv"))] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    work_dir: Annotated[Path | None, typer.Option(help="where the engine keeps files (vLLM: weights it reloads); "
                                                      "default: <state-dir>/worker-<port>")] = None,
    max_tokens_per_s: Annotated[float | None, typer.Option(min=0.001, help=(
        "cap this worker's generation at this many tokens per second (to emulate slower hardware, e.g. "
        "in benchmarks); default: no cap"))] = None,
    seed: int = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads (default 1 for presets)")] = None,
    vllm_python: Annotated[str | None, typer.Option(envvar="SWARM_VLLM_PYTHON", show_envvar=True,
                                                    help="vllm engine: Python of the vLLM environment")] = None,
) -> None:
    """Serve generation for a server's pool: join, load the current weights, then take traffic;
    heartbeat; leave cleanly on SIGTERM (running calls finish)."""
    if engine not in ("torch", "vllm"):
        fail(f"--engine must be torch or vllm, not {engine!r}", 2)
    secret = token or _token_file(state_dir)
    if not secret:
        fail("no worker token: pass $SWARM_WORKER_TOKEN (the server's <state-dir>/worker_token)", 2)
    model = fetch_model(model)  # a Hub name not in the cache and not downloadable: exit 2 before anything loads
    stopping.interrupt_on_sigterm()  # a stop while the engine loads; once serving, the worker's own shutdown
    from swarm.models.presets import is_preset

    if threads is not None or is_preset(model):
        import torch

        torch.set_num_threads(threads or 1)
    from swarm.pool.process import run_worker
    from swarm.pool.worker import WorkerOptions

    folder = work_dir or state_dir / f"worker-{port or os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    generator = _build(engine, model, folder, seed, capacity, vllm_python)
    options = WorkerOptions(server=server, token=secret, engine=engine, capacity=capacity, model=model,
                            advertise=advertise, max_tokens_per_s=max_tokens_per_s)
    run_worker(options, generator, host=host, port=port)


def _build(engine: str, model: str, folder: Path, seed: int, capacity: int, vllm_python: str | None) -> Any:
    """The worker's generator; a bad engine or model, or a stop while it loads, ends the command."""
    from swarm.pool.process import build_generator

    try:
        generator, _ = build_generator(engine, model, folder, seed=seed, capacity=capacity, vllm_python=vllm_python)
    except ValueError as exc:
        fail(f"cannot build the {engine} engine: {exc}", 2)
    except KeyboardInterrupt:
        fail("stopped before the worker was ready", 130)
    return generator


def _token_file(state_dir: Path) -> str | None:
    try:
        return (state_dir / "worker_token").read_text().strip() or None
    except OSError:
        return None
