"""The pruned-episode ledger of the durable buffer (``swarm.server.durability.store``): what retention keeps of an
episode once it deleted the episode's trace and rows.

Why: retention (``swarm.server.durability.retention``) deletes, after each checkpoint, everything stored of the
episodes trained at or before the oldest kept checkpoint's step: their timelines, their ``episodes``
row and their ``training_log`` rows (rolled-back ones included). Without this ledger the buffer would
still grow by an episode row (about 300 bytes) per episode for the life of the run. With it, what stays
of a pruned episode is one ``pruned`` row, ``(key, trained_step)`` in a ``WITHOUT ROWID`` table (about
40 bytes): ``key`` is the 16 bytes of a server-made id (32 lowercase hex digits) or else the id's text.
So nothing acknowledged becomes unaccountable: an audit finds every finished id in ``episodes`` or
here, trained once at the step recorded (``EpisodeStore.trained_counts`` and ``known``). Totals live in
meta (``PRUNED_TOTALS_KEY``), updated in the same transaction, so counting needs no scan.

What is gone with the rows: reward, metrics, metadata and the body digest. A retried finish of a
pruned episode is therefore accepted as the usual no-op without comparing bodies (it answers
``finished`` with no reward; ``swarm.server.episodes.lifecycle``). A rollback below the mark (a restore older
than the oldest kept checkpoint, when the newer ones failed to load) cannot train those episodes
again, their traces being gone: their ledger step becomes NULL and they count as dropped, reason
``trace pruned`` (``TRACE_PRUNED``).

Every function runs inside a store transaction on the store's connection.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any

__all__ = ["PRUNED_KEY", "PRUNED_TOTALS_KEY", "TRACE_PRUNED", "episode_key", "is_pruned", "prune", "pruned_ids",
           "rollback_pruned", "totals"]

PRUNED_KEY = "retention/pruned_through"  # meta: episodes trained at steps <= this were pruned
PRUNED_TOTALS_KEY = "retention/pruned_totals"  # meta: {"trained": n, "dropped": n, "last_step": s}
TRACE_PRUNED = "trace pruned"  # the drop reason of a pruned episode whose step a rollback undid

_HEX_ID = re.compile(r"[0-9a-f]{32}")


def episode_key(episode_id: str) -> bytes | str:
    """The ledger key of an id: 16 bytes for a server-made uuid hex id, the text itself otherwise
    (a BLOB never equals a TEXT in SQLite, so the two kinds cannot collide)."""
    return bytes.fromhex(episode_id) if _HEX_ID.fullmatch(episode_id) else episode_id


def _episode_id(key: bytes | str) -> str:
    return key.hex() if isinstance(key, bytes) else key


def _get(db: sqlite3.Connection, key: str, default: Any) -> Any:
    row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    return default if row is None else json.loads(row[0])


def _put(db: sqlite3.Connection, key: str, value: Any) -> None:
    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))


def totals(db: sqlite3.Connection) -> dict[str, int]:
    """``trained`` (pruned, trained in the live lineage), ``dropped`` (pruned, then rolled back) and
    ``last_step`` (the newest step of a pruned episode still trained; 0 when none)."""
    return {"trained": 0, "dropped": 0, "last_step": 0, **_get(db, PRUNED_TOTALS_KEY, {})}


def prune(db: sqlite3.Connection, through_step: int) -> tuple[int, int]:
    """Move the episodes trained at steps <= ``through_step`` into the ledger: delete their timelines,
    training-log rows and episode rows, record the mark. Returns ``(episodes, timelines)`` removed."""
    chosen = "SELECT seq FROM episodes WHERE trained_step <= ?"
    timelines = db.execute(f"DELETE FROM timelines WHERE episode_seq IN ({chosen})", (through_step,)).rowcount
    db.execute(f"DELETE FROM constrained_spans WHERE episode_seq IN ({chosen})", (through_step,))
    rows = db.execute("SELECT episode_id, trained_step FROM episodes WHERE trained_step <= ?", (through_step,)).fetchall()
    db.executemany("INSERT OR REPLACE INTO pruned(key, trained_step) VALUES (?, ?)",
                   [(episode_key(episode_id), step) for episode_id, step in rows])
    db.execute("DELETE FROM training_log WHERE episode_id IN (SELECT episode_id FROM episodes WHERE trained_step <= ?)",
               (through_step,))
    db.execute("DELETE FROM episodes WHERE trained_step <= ?", (through_step,))
    counted = totals(db)
    counted["trained"] += len(rows)
    counted["last_step"] = max([counted["last_step"], *(step for _, step in rows)])
    _put(db, PRUNED_TOTALS_KEY, counted)
    _put(db, PRUNED_KEY, through_step)
    return len(rows), int(timelines)


def rollback_pruned(db: sqlite3.Connection, step: int) -> int:
    """A rollback to ``step``: pruned episodes trained after it lose their step and count as dropped
    (``TRACE_PRUNED``); the mark comes down to ``step``. Returns how many. Scans the ledger only when
    the mark is above ``step`` (a restore older than the oldest kept checkpoint)."""
    if _get(db, PRUNED_KEY, 0) <= step:
        return 0
    undone = db.execute("UPDATE pruned SET trained_step=NULL WHERE trained_step > ?", (step,)).rowcount
    counted = totals(db)
    counted.update(trained=counted["trained"] - undone, dropped=counted["dropped"] + undone,
                   last_step=min(counted["last_step"], step))
    _put(db, PRUNED_TOTALS_KEY, counted)
    _put(db, PRUNED_KEY, step)
    return int(undone)


def is_pruned(db: sqlite3.Connection, episode_id: str) -> bool:
    return db.execute("SELECT 1 FROM pruned WHERE key=?", (episode_key(episode_id),)).fetchone() is not None


def pruned_ids(db: sqlite3.Connection) -> dict[str, int | None]:
    """Every pruned id -> the step that trained it (None: rolled back, dropped). Audits only: it reads
    the whole ledger."""
    return {_episode_id(key): step for key, step in db.execute("SELECT key, trained_step FROM pruned")}
