"""Rollouts to take away: a state dir's finished episodes as Parquet or JSON Lines, one row an episode.

Why: the durable buffer (``swarm.server.durability.store``) is the server's private bookkeeping, in a compact
binary encoding, and retention (``swarm.server.durability.retention``) drops the traces of old trained
episodes. People want the exact rollouts for offline analysis, SFT/DPO data or an audit, so this
reads the buffer **read-only** (``mode=ro``; WAL readers never block the server's writer, so it works
while a server runs) inside one read transaction (a consistent snapshot even while the server
trains or prunes) and writes what the store holds, faithfully:

- the episode's fields (``episode_id``, ``task_id``, ``group_id``, ``group_key``, ``category``,
  ``client_id``, ``reward``, ``metrics``/``metadata`` as JSON text, ``finished_at``), the step that
  trained it (``trained_step``, null when untrained), why it was dropped (``dropped``, null if not),
  ``merge``, ``calls``, ``drift_forks`` and the distinct ``policy_versions`` that sampled it;
- ``timelines``: each token timeline as stored: ``tokens``, ``loss_mask`` (1 on generated tokens),
  ``logprobs`` (float32 as stored), ``versions`` (the policy version of each call), ``temperature``, ``calls``, and
  ``prompt_length`` (tokens before the first generated one), ``constrained`` (``[start, end)`` spans of
  tokens sampled under a grammar: a forced tool call or JSON output); with a tokenizer also ``text``;
- ``prompt_token_ids`` / ``completion_token_ids``: the first timeline split at ``prompt_length`` (the
  whole episode when it merged into one timeline; forked episodes have the rest in ``timelines``),
  and ``prompt_text`` / ``completion_text`` when a tokenizer decodes them (the store keeps token ids
  only, never text, so text is null without one).

``since_step=N`` keeps episodes trained at step >= N; untrained and dropped episodes have no step and
are left out then (without it every stored episode is written). Episodes retention already pruned
(``swarm.server.durability.store_pruned``: only their id and step are left) are counted, not written. Rows
stream in batches (bounded memory), into a temporary file renamed over ``out`` at the end, so a
failed export leaves no half-written file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from swarm.atomic import replacing
from swarm.server.durability.store import PRUNED_KEY
from swarm.server.records.finished import unpack_array

__all__ = ["BUFFER_FILE", "PRUNED_KEY", "ExportError", "ExportFormat", "ExportResult", "export_episodes",
           "iter_episode_rows"]

BUFFER_FILE = "buffer.db"  # the durable buffer's name in a state dir (``swarm.server.app``)
ExportFormat = Literal["parquet", "jsonl"]
Decode = Callable[[Sequence[int]], str]
_BATCH = 256  # episodes read and written at a time: bounded memory on a buffer of any size


class ExportError(ValueError):
    """No buffer to read, an unknown format, or a destination that cannot be written."""


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    path: Path
    episodes: int
    pruned: int  # episodes in range retention had already pruned (not written)


def export_episodes(db_path: Path, out: Path, fmt: str, *, since_step: int | None = None,
                    through_step: int | None = None, decode: Decode | None = None) -> ExportResult:
    """Write the episodes of ``db_path`` (trained at ``since_step <= step <= through_step`` where
    given) to ``out`` atomically. Raises ``ExportError`` for a missing buffer or unknown format."""
    if fmt not in ("parquet", "jsonl"):
        raise ExportError(f"unknown format {fmt!r}: parquet or jsonl")
    counter = {"pruned": 0}
    with replacing(out, durable=True) as tmp:
        rows = iter_episode_rows(db_path, since_step=since_step, through_step=through_step, decode=decode,
                                 on_pruned=lambda n: counter.__setitem__("pruned", n))
        written = _write_parquet(rows, tmp) if fmt == "parquet" else _write_jsonl(rows, tmp)
    return ExportResult(path=out, episodes=written, pruned=counter["pruned"])


def iter_episode_rows(db_path: Path, *, since_step: int | None = None, through_step: int | None = None,
                      decode: Decode | None = None, on_pruned: Callable[[int], None] = lambda n: None
                      ) -> Iterator[dict[str, Any]]:
    """One dict an episode in finish order (the columns in the module docstring), read in one
    read-only snapshot of the buffer; ``on_pruned`` first hears how many in range were pruned."""
    db = _open_read_only(db_path)
    try:
        db.execute("BEGIN")  # one snapshot: a concurrent step or prune does not tear the export
        on_pruned(_pruned_in_range(db, since_step, through_step))
        where, args = [], []
        if since_step is not None:
            where.append("trained_step >= ?")
            args.append(since_step)
        if through_step is not None:
            where.append("trained_step <= ?")
            args.append(through_step)
        last_seq = 0
        while True:
            sql = _SELECT + " WHERE " + " AND ".join(["seq > ?", *where]) + " ORDER BY seq LIMIT ?"
            batch = db.execute(sql, (last_seq, *args, _BATCH)).fetchall()
            if not batch:
                break
            last_seq = batch[-1][0]
            traces = _timelines(db, [r[0] for r in batch])
            for fields in batch:
                yield _row(fields, traces.get(fields[0], []), decode)
        db.execute("COMMIT")
    finally:
        db.close()


def _pruned_in_range(db: sqlite3.Connection, since_step: int | None, through_step: int | None) -> int:
    """Pruned episodes trained in the range (all pruned ones without a range). Reads the ledger only
    when the range reaches down to the pruning mark (retention's own exports never do)."""
    row = db.execute("SELECT value FROM meta WHERE key=?", (PRUNED_KEY,)).fetchone()
    if row is None or (since_step is not None and since_step > int(json.loads(row[0]))):
        return 0
    if since_step is None and through_step is None:
        return int(db.execute("SELECT COUNT(*) FROM pruned").fetchone()[0])
    low, high = since_step or 0, 2**62 if through_step is None else through_step
    return int(db.execute("SELECT COUNT(*) FROM pruned WHERE trained_step BETWEEN ? AND ?", (low, high)).fetchone()[0])


def _open_read_only(db_path: Path) -> sqlite3.Connection:
    if not db_path.is_file():
        raise ExportError(f"no episode buffer at {db_path} (is this a `swarm serve` state dir?)")
    try:
        db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                             timeout=30.0)
        db.execute("SELECT 1 FROM episodes LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise ExportError(f"{db_path} is not a readable swarm buffer ({exc})") from None
    return db


_SELECT = ("SELECT seq, episode_id, task_id, group_id, group_key, group_size, category, client_id, reward, metrics,"
           " metadata, finished_at, merge, calls, drift_forks, trained_step, dropped FROM episodes")


def _timelines(db: sqlite3.Connection, seqs: list[int]) -> dict[int, list[dict[str, Any]]]:
    marks = ",".join("?" * len(seqs))
    found: dict[int, list[dict[str, Any]]] = {}
    for seq, tokens, mask, logprobs, versions, temperature, calls in db.execute(
            "SELECT episode_seq, tokens, loss_mask, logprobs, versions, temperature, calls FROM timelines"
            f" WHERE episode_seq IN ({marks}) ORDER BY episode_seq, idx", seqs):
        loss_mask = list(mask)
        found.setdefault(seq, []).append({
            "tokens": unpack_array("i", tokens), "loss_mask": loss_mask, "logprobs": unpack_array("f", logprobs),
            "versions": unpack_array("i", versions), "temperature": float(temperature), "calls": int(calls),
            "prompt_length": loss_mask.index(1) if 1 in loss_mask else len(loss_mask), "constrained": [],
        })
    for seq, idx, spans in db.execute(f"SELECT episode_seq, idx, spans FROM constrained_spans WHERE episode_seq IN "
                                      f"({marks})", seqs):
        flat = unpack_array("i", spans)
        found[seq][idx]["constrained"] = [list(pair) for pair in zip(flat[::2], flat[1::2], strict=True)]
    return found


def _row(fields: tuple[Any, ...], timelines: list[dict[str, Any]], decode: Decode | None) -> dict[str, Any]:
    (_seq, episode_id, task_id, group_id, group_key, group_size, category, client_id, reward, metrics, metadata,
     finished_at, merge, calls, drift_forks, trained_step, dropped) = fields
    versions = sorted({v for t in timelines for v in t["versions"]})
    first = timelines[0] if timelines else None
    prompt = first["tokens"][:first["prompt_length"]] if first else []
    completion = first["tokens"][first["prompt_length"]:] if first else []
    for timeline in timelines:
        timeline["text"] = decode(timeline["tokens"]) if decode else None
    return {
        "episode_id": episode_id, "task_id": task_id, "group_id": group_id, "group_key": group_key,
        "group_size": group_size, "category": category, "client_id": client_id, "reward": float(reward),
        "trained_step": trained_step, "dropped": dropped, "policy_versions": versions,
        "finished_at": float(finished_at), "merge": bool(merge), "calls": calls, "drift_forks": drift_forks,
        "metrics": metrics, "metadata": metadata,
        "prompt_token_ids": prompt, "completion_token_ids": completion,
        "prompt_text": decode(prompt) if decode and first else None,
        "completion_text": decode(completion) if decode and first else None,
        "timelines": timelines,
    }


def _write_jsonl(rows: Iterator[dict[str, Any]], path: Path) -> int:
    written = 0
    with open(path, "w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False, allow_nan=True) + "\n")
            written += 1
    return written


def _write_parquet(rows: Iterator[dict[str, Any]], path: Path) -> int:
    import pyarrow as pa  # only for this format (a declared dependency, but a heavy import)
    import pyarrow.parquet as pq

    timeline = pa.struct([("tokens", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                          ("logprobs", pa.list_(pa.float32())), ("versions", pa.list_(pa.int32())),
                          ("temperature", pa.float64()), ("calls", pa.int32()), ("prompt_length", pa.int32()),
                          ("constrained", pa.list_(pa.list_(pa.int32()))), ("text", pa.string())])
    schema = pa.schema([
        ("episode_id", pa.string()), ("task_id", pa.string()), ("group_id", pa.string()), ("group_key", pa.string()),
        ("group_size", pa.int32()), ("category", pa.string()), ("client_id", pa.string()), ("reward", pa.float64()),
        ("trained_step", pa.int64()), ("dropped", pa.string()), ("policy_versions", pa.list_(pa.int32())),
        ("finished_at", pa.float64()), ("merge", pa.bool_()), ("calls", pa.int32()), ("drift_forks", pa.int32()),
        ("metrics", pa.string()), ("metadata", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())), ("completion_token_ids", pa.list_(pa.int32())),
        ("prompt_text", pa.string()), ("completion_text", pa.string()), ("timelines", pa.list_(timeline)),
    ])
    written = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                written, batch = written + len(batch), []
        if batch or written == 0:  # an empty export still has the schema
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            written += len(batch)
    return written
