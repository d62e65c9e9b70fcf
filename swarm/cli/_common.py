"""What every ``swarm`` verb shares: the typer app, the consoles, the option types, logging set-up,
and how a verb finds its server URL and tokens (see ``swarm.cli``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.logging import RichHandler

from swarm.client import SwarmClient

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
STATE_DIR_HELP = "where `swarm serve` keeps its token and state"
StateDir = Annotated[Path, typer.Option(help=STATE_DIR_HELP)]
AsJson = Annotated[bool, typer.Option("--json", help="print raw JSON (the protocol model)")]

F = TypeVar("F")


def grouped(flags: type[F], options: Mapping[str, Any]) -> F:
    """A command's options as ``flags``, a dataclass of typed groups: each field is a group (a dataclass
    whose fields are option names, shown under its ``PANEL`` in ``--help``) filled by name. Every option
    belongs to exactly one group (``TypeError`` names any left out)."""
    hints = typing.get_type_hints(flags)
    groups: dict[str, Any] = {}
    for part in dataclasses.fields(cast(Any, flags)):  # a dataclass (the TypeVar cannot say so)
        group = hints[part.name]
        groups[part.name] = group(**{f.name: options[f.name] for f in dataclasses.fields(group)})
    placed = {f.name for group in groups.values() for f in dataclasses.fields(group)}
    if placed != set(options):
        raise TypeError(f"options outside a group of {flags.__name__}: {sorted(set(options) - placed)}")
    return flags(**groups)


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug logging")] = False) -> None:
    # At a terminal rich's columns; elsewhere one plain line a record (a rich log table pads every line to the width).
    handler = RichHandler(console=err, show_path=False) if err.is_terminal else logging.StreamHandler(sys.stderr)
    plain = "" if err.is_terminal else "[%(asctime)s] %(levelname)-8s "
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=plain + "%(name)s: %(message)s",
                        datefmt="%X", handlers=[handler])
    for noisy in ("httpx", "httpcore", "openai", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)  # one line, paths unbroken
    raise typer.Exit(code)


def fetch_model(model: str) -> str:
    """``model`` ready to load. A Hugging Face Hub name is downloaded into the hub cache (offline: found
    there) and pinned to the commit it resolved to, ``org/name@<commit>``, so the generator and the trainer of
    the process load that one snapshot even if the Hub's branch moves meanwhile; any other name is
    returned as it is (they resolve it). A Hub model neither cached nor downloadable ends the command (exit 2)
    with the download command, before anything loads or listens."""
    from swarm.models.hub import hub_snapshot, parse_hub_name

    name = parse_hub_name(model)
    if name is None:
        return model
    try:
        return str(name.pinned(hub_snapshot(name)))
    except ValueError as exc:
        fail(str(exc), 2)


def server_url(url: str | None, state_dir: Path) -> str:
    if url:
        return url
    try:
        return str(json.loads((state_dir / "server.json").read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        fail(f"no server URL given and no running server recorded in {state_dir / 'server.json'}", 2)


def connect(url: str | None, token: str | None, state_dir: Path, retry_for_s: float = _QUICK_RETRY_S,
            client_token: str | None = None) -> SwarmClient:
    """A client with the control token (``token``, else the state dir's file); with ``client_token``
    (or, without it and without ``token``, the state dir's ``client_token`` file) claims use that."""
    client_file = None if client_token or token else state_dir / "client_token"
    try:
        return SwarmClient(server_url(url, state_dir), token=token, token_file=state_dir / "token",
                           client_token=client_token, client_token_file=client_file, retry_for_s=retry_for_s)
    except ValueError as exc:
        fail(str(exc), 2)


def print_json(model: Any) -> None:
    if isinstance(model, list):
        out.print_json(json.dumps([m.model_dump(mode="json") for m in model]))
    else:
        out.print_json(model.model_dump_json())
