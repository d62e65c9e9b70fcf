"""``swarm config|pause|resume|checkpoint|stop|key``: steer a running server, and mint run keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from swarm.cli._common import DEFAULT_STATE_DIR, AsJson, StateDir, Token, Url, app, connect, err, fail, out, print_json
from swarm.client import SwarmError
from swarm.config import SECTIONS, key_help


@app.command()
def config(url: Url = None,
           pairs: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...",
                                                             help="values to change (JSON where possible)")] = None,
           json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show the live config, or change keys: `swarm config URL lr=3e-4 temperature=0.8`."""
    if url and "=" in url and not url.startswith(("http://", "https://")):
        pairs, url = [url, *(pairs or [])], None  # `swarm config lr=1e-4` with the URL from server.json
    values = _parse_pairs(pairs or [])
    with connect(url, token, state_dir) as client:
        try:
            view = client.patch_config(**values) if values else client.config()
        except SwarmError as exc:
            fail(str(exc))
    if json_:
        print_json(view)
        return
    table = Table(title=f"config version {view.version}")
    for column in ("section", "key", "value", "meaning"):
        table.add_column(column, style="bold" if column == "key" else None)
    order = [key for keys in SECTIONS.values() for key in keys]
    for key in sorted(view.values, key=lambda k: (order.index(k) if k in order else len(order), k)):
        section, _default, meaning = key_help(key) if key in order else ("", None, "")  # a newer server's key
        table.add_row(section, key, json.dumps(view.values[key]), meaning, style="green" if key in values else None)
    out.print(table)


def _parse_pairs(pairs: list[str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            fail(f"expected KEY=VALUE, got {pair!r}", 2)
        try:
            values[key.strip()] = json.loads(raw)
        except ValueError:
            values[key.strip()] = raw  # a bare word (grpo, sync) is a string
    return values


def _control(action: str, url: str | None, token: str | None, state_dir: Path) -> None:
    with connect(url, token, state_dir) as client:
        try:
            result = client.control(action)
        except SwarmError as exc:
            fail(str(exc))
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


@app.command()
def key(run: Annotated[str, typer.Option("--run", help="the run's name (letters, digits, _ and -)")],
        url: Url = None, json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print a run key: one key for a whole run (`OPENAI_API_KEY=$(swarm key --run r1)`); each
    conversation sent with it is an episode of its own, rewarded by episode or response id."""
    with connect(url, token, state_dir) as client:
        try:
            minted = client.run_key(run)
        except SwarmError as exc:
            fail(str(exc))
        except ValueError:  # the request model refused the name before sending it
            fail(f"--run {run!r}: a run's name is letters, digits, _ and - (at most 64, no dots)", 2)
    if json_:
        print_json(minted)
        return
    out.print(minted.api_key, highlight=False, soft_wrap=True)  # alone on stdout, for $(...)
    err.print(f"run {minted.run}: base URL {minted.base_url}; post rewards to "
              "/api/v1/episodes/{episode, response or session id}/finish", highlight=False, soft_wrap=True)
