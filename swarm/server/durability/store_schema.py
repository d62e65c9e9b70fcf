"""The durable buffer's SQLite schema (``swarm.server.durability.store``): finished episodes and their
timelines, the training log (which step consumed which episode; rolled-back rows kept for audit),
closed episodes, the event log, step metrics, key/value meta and the ledger of episodes retention
pruned (``swarm.server.durability.store_pruned``). Every statement is idempotent (``IF NOT EXISTS``), so opening
an existing buffer runs it again harmlessly.

Versions: 2 added ``pruned``; 3 added ``constrained_spans`` (the tokens of a timeline sampled under
a grammar, ``Timeline.constrained``: a row only for timelines that have any). A buffer of a version
in ``UPGRADES_FROM`` is upgraded in place when opened (the changes since were additions only, made by
running ``SCHEMA``); any other version is refused, and a server older than the buffer refuses it too."""

__all__ = ["SCHEMA", "SCHEMA_VERSION", "UPGRADES_FROM"]

SCHEMA_VERSION = 3  # stored in meta
UPGRADES_FROM = frozenset({1, 2})  # versions whose buffers SCHEMA brings to SCHEMA_VERSION
SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,   -- finish order
    episode_id   TEXT NOT NULL UNIQUE,
    task_id      TEXT NOT NULL,
    group_id     TEXT NOT NULL,
    group_key    TEXT,
    group_size   INTEGER NOT NULL,
    category     TEXT,
    client_id    TEXT NOT NULL,
    reward       REAL NOT NULL,
    metrics      TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    finished_at  REAL NOT NULL,
    merge        INTEGER NOT NULL,
    calls        INTEGER NOT NULL,
    drift_forks  INTEGER NOT NULL,
    digest       TEXT NOT NULL,                        -- identity of the body, for idempotent saves
    trained_step INTEGER,                              -- NULL until a live training step consumed it
    dropped      TEXT                                  -- reason, when the core discarded it untrained
);
CREATE TABLE IF NOT EXISTS timelines (
    episode_seq INTEGER NOT NULL REFERENCES episodes(seq),
    idx         INTEGER NOT NULL,
    tokens      BLOB NOT NULL,
    loss_mask   BLOB NOT NULL,
    logprobs    BLOB NOT NULL,
    versions    BLOB NOT NULL,
    temperature REAL NOT NULL,
    calls       INTEGER NOT NULL,
    PRIMARY KEY (episode_seq, idx)
);
CREATE TABLE IF NOT EXISTS constrained_spans (
    episode_seq INTEGER NOT NULL REFERENCES episodes(seq),
    idx         INTEGER NOT NULL,                      -- the timeline's idx
    spans       BLOB NOT NULL,                         -- int32 start, end pairs
    PRIMARY KEY (episode_seq, idx)
);
CREATE TABLE IF NOT EXISTS training_log (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    step        INTEGER NOT NULL,
    episode_id  TEXT NOT NULL,
    at          REAL NOT NULL,
    rolled_back INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS training_log_live ON training_log(rolled_back, step);
CREATE TABLE IF NOT EXISTS closed_episodes (
    episode_id TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id   INTEGER PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS step_metrics (
    step INTEGER PRIMARY KEY,                          -- live lineage only: rolled back with the step
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pruned (
    key          BLOB PRIMARY KEY,                     -- the episode id: 16 bytes for a uuid hex id, else its text
    trained_step INTEGER                               -- NULL: a rollback undid its step (dropped, trace pruned)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
