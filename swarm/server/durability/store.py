"""The durable episode buffer: finished episodes and exactly-once training bookkeeping on SQLite.

Why: a swarm server must not lose an episode whose ``finish`` returned, and must not train one twice,
even when the server process is SIGKILLed and restarted from an older checkpoint. So every finished
episode (reward, metadata and its token-exact trace) is committed here *before* ``finish`` answers,
and every training step records which episodes it consumed (``training_log``). On restart the core
restores checkpoint step ``S``, calls ``rollback_after(S)`` (updates after ``S`` were lost with the
process, so their episodes become untrained again) and rebuilds its pending groups from
``untrained()``. Rolled-back log rows are kept, flagged, for audit. Retention (``swarm.server.durability.retention``)
moves episodes no restart can train again into a compact ledger (``swarm.server.durability.store_pruned``).

Durability choice: WAL journal with ``synchronous=NORMAL`` (the default here). A commit in WAL mode
``write()``s the transaction's frames, including the commit frame, into the ``-wal`` file before
``COMMIT`` returns; with NORMAL SQLite only skips the ``fsync``. A SIGKILLed process cannot take data
already handed to the kernel with it: the page cache belongs to the OS, and the next open replays
the WAL. So NORMAL survives process kills (the target), and only an OS crash or power loss could drop
the last few commits. Pass ``synchronous="FULL"`` to fsync every commit when that matters too.

Traces are stored compactly (``swarm.server.records.finished``): tokens and versions int32, loss masks one
byte per token, log-probs **float32** (the round trip is exact for tokens, masks and versions;
log-probs come back within float32 precision, about 1e-7 relative).

Thread-safety: one connection guarded by a lock; every public method is one transaction.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from swarm.protocol import Event
from swarm.server.durability import store_pruned as ledger
from swarm.server.durability.store_pruned import PRUNED_KEY, TRACE_PRUNED
from swarm.server.durability.store_schema import SCHEMA, SCHEMA_VERSION, UPGRADES_FROM
from swarm.server.records.finished import (
    FinishedEpisode,
    InvalidEpisode,
    Outcome,
    body_digest,
    pack_array,
    unpack_array,
)
from swarm.server.records.timeline import EpisodeTrace, Timeline

log = logging.getLogger(__name__)

__all__ = ["PRUNED_KEY", "EpisodeConflict", "EpisodeStore", "FinishedEpisode", "StoreError", "store_safely"]


def store_safely(what: str, fn: Callable[[], Any]) -> None:
    """Bookkeeping writes after the fact (drops, closes): log a failure, never break the server."""
    try:
        fn()
    except Exception:
        log.exception("durable buffer: %s failed", what)


class StoreError(ValueError):
    """Bad input or an impossible bookkeeping request; nothing was written."""


class EpisodeConflict(StoreError):
    """An episode id was saved before with a different body (the HTTP layer answers 409)."""


# --------------------------------------------------------------------------- the store


class EpisodeStore:
    """Finished episodes, training bookkeeping, closed-episode audit, event log and a small key/value
    table, in one SQLite file (WAL)."""

    def __init__(self, path: str | Path, *, synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
                 keep_events: int = 10_000) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise StoreError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._keep_events = keep_events
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so every method is one transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        try:
            self._open(synchronous)
        except sqlite3.DatabaseError as exc:  # garbage bytes, a truncated header: refuse, touch nothing
            self._db.close()
            raise StoreError(f"{self.path} is not a readable swarm buffer database ({exc}); move it aside to "
                             "start with an empty buffer") from None
        except BaseException:
            self._db.close()
            raise

    def _open(self, synchronous: str) -> None:
        """Settings, schema and its version check; the first statement reads the file's header, so a
        file that is not an SQLite database fails here (``sqlite3.DatabaseError``)."""
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._lock:
            self._db.executescript(SCHEMA)
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or json.loads(row[0]) in UPGRADES_FROM:  # new, or upgraded in place by SCHEMA
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                             (json.dumps(SCHEMA_VERSION),))
        elif json.loads(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {row[0]}, this server reads {SCHEMA_VERSION}")

    # -- plumbing

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (SQLITE_FULL, SQLITE_IOERR): a second ROLLBACK
                # would raise and hide the error that says why (a full disk answers 507, not 500).
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal_mode(self) -> str:
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    # -- finished episodes

    def save_finished(self, record: FinishedEpisode) -> bool:
        """Commit one finished episode; returns after the commit. ``True`` if new, ``False`` if the
        same id was already stored with the same body (a retried finish). A different body for a
        stored id raises ``EpisodeConflict``; invalid records raise ``StoreError``. Nothing is written
        on error. An id retention pruned is the no-op ``False`` (its digest is gone with its row)."""
        try:
            record.validate()
        except InvalidEpisode as exc:
            raise StoreError(str(exc)) from None
        digest = body_digest(record)
        outcome, trace = record.outcome, record.trace
        try:
            metrics = json.dumps(outcome.metrics, sort_keys=True, allow_nan=False)
            metadata = json.dumps(outcome.metadata, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"metrics and metadata must be JSON with finite numbers: {exc}") from None
        with self._tx() as db:
            row = db.execute("SELECT digest FROM episodes WHERE episode_id=?", (record.episode_id,)).fetchone()
            if row is not None:
                if row[0] == digest:
                    return False
                raise EpisodeConflict(f"episode {record.episode_id} was already finished with a different body")
            if ledger.is_pruned(db, record.episode_id):
                return False
            cur = db.execute(
                "INSERT INTO episodes(episode_id, task_id, group_id, group_key, group_size, category, client_id,"
                " reward, metrics, metadata, finished_at, merge, calls, drift_forks, digest)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.episode_id, record.task_id, record.group_id, record.group_key, record.group_size,
                 record.category, record.client_id, float(outcome.reward), metrics, metadata, float(record.finished_at),
                 int(trace.merge), trace.calls, trace.drift_forks, digest),
            )
            seq = cur.lastrowid
            db.executemany(
                "INSERT INTO timelines(episode_seq, idx, tokens, loss_mask, logprobs, versions, temperature, calls)"
                " VALUES (?,?,?,?,?,?,?,?)",
                [(seq, i, pack_array("i", t.tokens), bytes(t.loss_mask), pack_array("f", t.logprobs),
                  pack_array("i", t.versions), float(t.temperature), int(t.calls))
                 for i, t in enumerate(trace.timelines)],
            )
            db.executemany("INSERT INTO constrained_spans(episode_seq, idx, spans) VALUES (?,?,?)",
                           [(seq, i, pack_array("i", [x for span in t.constrained for x in span]))
                            for i, t in enumerate(trace.timelines) if t.constrained])
        return True

    def get(self, episode_id: str) -> FinishedEpisode | None:
        """The stored episode; None when unknown or pruned (``known`` tells those apart)."""
        with self._lock:
            rows = self._db.execute(_SELECT + " WHERE episode_id=?", (episode_id,)).fetchall()
            found = self._hydrate(rows)
        return found[0] if found else None

    def known(self, episode_id: str) -> bool:
        """This id finished here: stored, or pruned by retention (``swarm.server.durability.store_pruned``)."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
            return row is not None or ledger.is_pruned(self._db, episode_id)

    def untrained(self) -> list[FinishedEpisode]:
        """Finished episodes no live step consumed and the core did not drop, in finish order."""
        with self._lock:
            rows = self._db.execute(_SELECT + " WHERE trained_step IS NULL AND dropped IS NULL ORDER BY seq").fetchall()
            return self._hydrate(rows)

    def pending_groups(self) -> dict[str, list[FinishedEpisode]]:
        """``untrained()`` grouped by group instance (``group_key`` or else ``group_id``), groups in
        the order their first member finished: what a restarted core re-files as trainable groups
        (members still claimed at the crash are gone, so each group holds what finished)."""
        groups: dict[str, list[FinishedEpisode]] = {}
        for episode in self.untrained():
            groups.setdefault(episode.group, []).append(episode)
        return groups

    def _hydrate(self, rows: list[tuple[Any, ...]]) -> list[FinishedEpisode]:
        out: list[FinishedEpisode] = []
        for (seq, episode_id, task_id, group_id, group_key, group_size, category, client_id, reward, metrics,
             metadata, finished_at, merge, calls, drift_forks) in rows:
            timelines = [
                Timeline(tokens=unpack_array("i", tok), loss_mask=list(mask), logprobs=unpack_array("f", lps),
                         versions=unpack_array("i", ver), temperature=temp, calls=tcalls)
                for tok, mask, lps, ver, temp, tcalls in self._db.execute(
                    "SELECT tokens, loss_mask, logprobs, versions, temperature, calls FROM timelines"
                    " WHERE episode_seq=? ORDER BY idx", (seq,))
            ]
            for idx, spans in self._db.execute("SELECT idx, spans FROM constrained_spans WHERE episode_seq=?", (seq,)):
                flat = unpack_array("i", spans)
                timelines[idx].constrained = list(zip(flat[::2], flat[1::2], strict=True))
            out.append(FinishedEpisode(
                episode_id=episode_id, task_id=task_id, group_id=group_id, group_key=group_key,
                group_size=group_size, category=category, client_id=client_id,
                outcome=Outcome(reward=reward, metrics=json.loads(metrics), metadata=json.loads(metadata)),
                finished_at=finished_at,
                trace=EpisodeTrace(merge=bool(merge), timelines=timelines, calls=calls, drift_forks=drift_forks),
            ))
        return out

    # -- training bookkeeping

    def mark_trained(self, episode_ids: Iterable[str], step: int) -> None:
        """Record that training step ``step`` consumed these episodes. Raises ``StoreError`` (and
        writes nothing) if an id is unknown, already trained in the live lineage, dropped, or if a
        live step after ``step`` exists (call ``rollback_after`` first)."""
        with self._tx() as db:
            _mark_trained(db, list(dict.fromkeys(episode_ids)), step)

    def commit_step(self, step: int, trained: Iterable[str], *, dropped: Mapping[str, Iterable[str]] | None = None,
                    meta: Mapping[str, Any] | None = None, metrics: str | None = None) -> None:
        """Everything one training step changes, in ONE transaction: the episodes it trained, the
        ones it dropped (reason -> ids), meta values (the policy version) and its metrics document.
        A crash leaves either all of it or none of it, so a restart never sees a step half-recorded.
        Raises ``StoreError`` (and writes nothing) on the conditions of ``mark_trained``."""
        with self._tx() as db:
            _mark_trained(db, list(dict.fromkeys(trained)), step)
            for reason, ids in (dropped or {}).items():
                _mark_dropped(db, ids, reason)
            for key, value in (meta or {}).items():
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))
            if metrics is not None:
                db.execute("INSERT OR REPLACE INTO step_metrics(step, body) VALUES (?, ?)", (step, metrics))

    def rollback_after(self, step: int) -> int:
        """Forget training steps > ``step`` (their update was lost with an older checkpoint restore):
        their episodes become untrained again (those retention pruned cannot: dropped, ``trace
        pruned``); log rows are kept with ``rolled_back=1``. Returns how many episodes were reset."""
        with self._tx() as db:
            ledger.rollback_pruned(db, step)
            reset = db.execute("UPDATE episodes SET trained_step=NULL WHERE trained_step > ?", (step,)).rowcount
            db.execute("UPDATE training_log SET rolled_back=1 WHERE rolled_back=0 AND step > ?", (step,))
            db.execute("DELETE FROM step_metrics WHERE step > ?", (step,))
        if reset:
            log.info("rolled back %d episodes trained after step %d", reset, step)
        return reset

    def mark_dropped(self, episode_ids: Iterable[str], reason: str) -> None:
        """The core discarded these finished episodes untrained (group too small, too stale)."""
        with self._tx() as db:
            _mark_dropped(db, episode_ids, reason)

    def last_trained_step(self) -> int:
        with self._lock:
            return _last_step(self._db)

    def trained_counts(self, include_rolled_back: bool = False) -> dict[str, int]:
        """``episode_id -> times trained`` (live lineage unless ``include_rolled_back``): the audit a
        chaos test uses to prove exactly-once training. A pruned episode still trained counts once
        (its log rows, rolled-back ones too, went with it)."""
        sql = "SELECT episode_id, COUNT(*) FROM training_log"
        if not include_rolled_back:
            sql += " WHERE rolled_back=0"
        with self._lock:
            counts = dict(self._db.execute(sql + " GROUP BY episode_id").fetchall())
            counts.update({e: 1 for e, step in ledger.pruned_ids(self._db).items() if step is not None})
        return counts

    def pruned_steps(self) -> dict[str, int | None]:
        """Every episode retention pruned -> the step that trained it (None: a rollback undid it, so
        it counts as dropped). Reads the whole ledger: for audits."""
        with self._lock:
            return ledger.pruned_ids(self._db)

    def training_log(self) -> list[tuple[int, str, bool]]:
        """Every ``(step, episode_id, rolled_back)`` row in the order written, less those of pruned
        episodes (``pruned_steps``)."""
        with self._lock:
            rows = self._db.execute("SELECT step, episode_id, rolled_back FROM training_log ORDER BY id").fetchall()
        return [(s, e, bool(r)) for s, e, r in rows]

    # -- retention (swarm.server.durability.retention)

    def prune(self, through_step: int) -> tuple[int, int]:
        """Move the episodes trained at steps <= ``through_step`` to the pruned ledger: their traces,
        rows and log rows go, one compact record each stays (``swarm.server.durability.store_pruned``); records the
        mark (``PRUNED_KEY``). Returns ``(episodes, timelines)`` removed. SQLite reuses the freed pages,
        so the file reaches a steady size rather than shrinking."""
        with self._tx() as db:
            return ledger.prune(db, through_step)

    # -- aborted / expired episodes (no trace is kept; they are counted and audited)

    def record_closed(self, episode_id: str, state: Literal["aborted", "expired"], reason: str = "") -> None:
        if state not in ("aborted", "expired"):
            raise StoreError(f"state must be aborted or expired, got {state!r}")
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO closed_episodes(episode_id, state, reason, at) VALUES (?,?,?,?)",
                       (episode_id, state, reason, time.time()))

    def counts(self) -> dict[str, int]:
        """finished, trained, untrained, dropped, aborted, expired (matches ``protocol.EpisodeCounts``
        field names where they overlap)."""
        with self._lock:
            stored, trained, dropped = self._db.execute(
                "SELECT COUNT(*), COUNT(trained_step), COUNT(dropped) FROM episodes").fetchone()
            closed = dict(self._db.execute("SELECT state, COUNT(*) FROM closed_episodes GROUP BY state").fetchall())
            pruned = ledger.totals(self._db)  # the ledger's episodes are finished, and trained or dropped
        return {"finished": stored + pruned["trained"] + pruned["dropped"], "trained": trained + pruned["trained"],
                "untrained": stored - trained - dropped, "dropped": dropped + pruned["dropped"],
                "aborted": closed.get("aborted", 0), "expired": closed.get("expired", 0)}

    def drop_reasons(self) -> dict[str, int]:
        """Dropped episodes by the reason they were dropped for."""
        with self._lock:
            rows = self._db.execute(
                "SELECT dropped, COUNT(*) FROM episodes WHERE dropped IS NOT NULL GROUP BY dropped").fetchall()
            pruned = ledger.totals(self._db)["dropped"]
        reasons = {str(reason): int(n) for reason, n in rows}
        return reasons | ({TRACE_PRUNED: reasons.get(TRACE_PRUNED, 0) + pruned} if pruned else {})

    def cursor(self) -> dict[str, int]:
        """The buffer cursor to put in a checkpoint's server_state."""
        with self._lock:  # AUTOINCREMENT keeps the highest seq ever used in sqlite_sequence, pruned or not
            last_seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name='episodes'"
                                        ).fetchone()[0]
            return {"last_seq": int(last_seq), "trained_step": _last_step(self._db)}

    # -- event log (so event ids and replay survive a restart)

    def append_event(self, event: Event) -> None:
        """Persist one event; suitable as ``EventBus(journal=store)``."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO events(id, body) VALUES (?, ?)", (event.id, event.model_dump_json()))
            if event.id % 1000 == 0:  # prune now and then, not on every insert
                db.execute("DELETE FROM events WHERE id <= ?", (event.id - self._keep_events,))

    def recent_events(self, limit: int = 10_000) -> list[Event]:
        with self._lock:
            rows = self._db.execute("SELECT body FROM events ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [Event.model_validate_json(body) for (body,) in reversed(rows)]

    def last_event_id(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    # -- per-step training metrics, so /api/v1/metrics survives a restart

    def save_step_metrics(self, step: int, body: str) -> None:
        """Keep one step's metrics (a ``StepMetrics`` JSON document) for the live lineage."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO step_metrics(step, body) VALUES (?, ?)", (step, body))

    def step_metrics(self, after: int = 0, limit: int = -1) -> list[str]:
        """Every kept step's metrics document after step ``after`` (at most ``limit``), in step order."""
        with self._lock:
            return [row[0] for row in self._db.execute(
                "SELECT body FROM step_metrics WHERE step > ? ORDER BY step LIMIT ?", (after, limit))]

    def newest_step_metrics(self, count: int) -> list[str]:
        """The newest ``count`` kept metrics documents (row 0 included), in step order."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM step_metrics ORDER BY step DESC LIMIT ?", (count,)).fetchall()
        return [row[0] for row in reversed(rows)]

    # -- small key/value state (e.g. the highest policy version ever served)

    def put_meta(self, key: str, value: Any) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])


_SELECT = (
    "SELECT seq, episode_id, task_id, group_id, group_key, group_size, category, client_id, reward, metrics, metadata,"
    " finished_at, merge, calls, drift_forks FROM episodes"
)


def _last_step(db: sqlite3.Connection) -> int:
    """The newest live training step, pruned episodes' steps included (0 before the first)."""
    value = db.execute("SELECT MAX(step) FROM training_log WHERE rolled_back=0").fetchone()[0]
    return max(int(value or 0), ledger.totals(db)["last_step"])


def _mark_trained(db: sqlite3.Connection, ids: list[str], step: int) -> None:
    if step < 1:
        raise StoreError(f"training steps count from 1, got {step}")
    newest = _last_step(db)
    if newest > step:
        raise StoreError(f"step {step} is older than live step {newest}: rollback_after({step - 1}) first")
    for episode_id in ids:
        row = db.execute("SELECT trained_step, dropped FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        if row is None:
            raise StoreError(f"episode {episode_id} is not a stored finished episode")
        if row[0] is not None:
            raise StoreError(f"episode {episode_id} was already trained in step {row[0]}")
        if row[1] is not None:
            raise StoreError(f"episode {episode_id} was dropped ({row[1]})")
        db.execute("UPDATE episodes SET trained_step=? WHERE episode_id=?", (step, episode_id))
    now = time.time()
    db.executemany("INSERT INTO training_log(step, episode_id, at) VALUES (?,?,?)",
                   [(step, episode_id, now) for episode_id in ids])


def _mark_dropped(db: sqlite3.Connection, episode_ids: Iterable[str], reason: str) -> None:
    db.executemany("UPDATE episodes SET dropped=? WHERE episode_id=? AND trained_step IS NULL",
                   [(reason or "dropped", episode_id) for episode_id in episode_ids])
