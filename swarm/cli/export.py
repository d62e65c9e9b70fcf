"""``swarm export``: a state dir's finished episodes as Parquet or JSON Lines (``swarm.server.durability.export``).

Reads the buffer read-only, so it runs beside a live server. Text is decoded only when a tokenizer is
at hand cheaply: ``--tokenizer auto`` takes the newest checkpoint's model folder when it holds tokenizer
files, a path names a model folder, ``none`` writes token ids only (the store keeps no text).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from swarm.cli._common import DEFAULT_STATE_DIR, app, err, fail

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@app.command()
def export(
    out: Annotated[Path, typer.Option("--out", help="the file to write (replaced atomically)")],
    state_dir: Annotated[Path, typer.Option(help="the `swarm serve` state dir to read")] = DEFAULT_STATE_DIR,
    format_: Annotated[str, typer.Option("--format", help="parquet or jsonl")] = "parquet",
    since_step: Annotated[int | None, typer.Option(help="only episodes trained at this step or later "
                                                   "(untrained ones are left out then)")] = None,
    tokenizer: Annotated[str, typer.Option(help="auto (the newest checkpoint's), none, or a model folder: "
                                           "decodes prompt and completion text")] = "auto",
) -> None:
    """Write one row per finished episode: ids, reward, trained step, policy versions, token timelines."""
    if format_ not in ("parquet", "jsonl"):
        fail(f"unknown --format {format_!r}: parquet or jsonl", 2)
    if not state_dir.is_dir():
        fail(f"no state dir at {state_dir}", 2)
    from swarm.server.durability.export import (  # the server package: only here
        BUFFER_FILE,
        ExportError,
        export_episodes,
    )

    decode = _decoder(state_dir, tokenizer)
    try:
        result = export_episodes(state_dir / BUFFER_FILE, out, format_, since_step=since_step, decode=decode)
    except ExportError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"could not write {out}: {exc}")
    skipped = f"; {result.pruned} older ones were pruned by retention (not written)" if result.pruned else ""
    err.print(f"wrote {result.episodes} episodes to {result.path}{skipped}", highlight=False, soft_wrap=True)


def _decoder(state_dir: Path, choice: str) -> Any:
    """A ``decode(ids) -> str`` from the chosen tokenizer folder, or None (token ids only)."""
    if choice == "none":
        return None
    folder = _newest_checkpoint_model(state_dir) if choice == "auto" else Path(choice)
    if folder is None:
        return None
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        if choice != "auto":
            fail(f"no tokenizer files in {folder}", 2)
        return None
    from swarm.text.templates import load_tokenizer

    loaded = load_tokenizer(folder)

    def decode(ids: Sequence[int]) -> str:
        return str(loaded.decode(list(ids)))

    return decode


def _newest_checkpoint_model(state_dir: Path) -> Path | None:
    root = state_dir / "checkpoints"
    steps = sorted((int(p.name.removeprefix("step-")), p) for p in root.glob("step-*")
                   if p.name.removeprefix("step-").isdigit()) if root.is_dir() else []
    return steps[-1][1] / "weights" if steps else None
