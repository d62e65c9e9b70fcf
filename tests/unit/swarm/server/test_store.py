"""The durable episode buffer: exact round trips, WAL, SIGKILL survival, exactly-once bookkeeping."""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from swarm.server.durability.store import EpisodeConflict, EpisodeStore, FinishedEpisode, StoreError
from swarm.server.records.finished import Outcome
from swarm.server.records.timeline import EpisodeTrace

ROOT = Path(__file__).resolve().parents[4]


def _trace(seed: int) -> EpisodeTrace:
    """A real multi-turn trace built through the timeline code: a merged turn (constrained: sampled under a
    grammar) plus a drift fork."""
    trace = EpisodeTrace()
    sys_prompt = [1, 2, 3, seed % 300]
    first = [10 + seed % 50, 11, 12]
    trace.record(sys_prompt, [(first, [-0.1234567, -1.5, -2.0e-5])], version=seed % 7, temperature=1.0)
    trace.record(sys_prompt + first + [99, 98], [([40, 41], [-0.3, -0.7]), ([42], [-3.25])], version=seed % 7 + 1,
                 temperature=1.0, constrained=True)
    trace.record([5, 6], [([70000, 2**31 - 1], [-12.5, -math.pi])], version=3, temperature=0.7)
    return trace


def _episode(i: int, **over: object) -> FinishedEpisode:
    """Episode ``i`` of a group of four; ``over`` replaces its fields (``reward``, ``metrics`` and
    ``metadata``: its outcome's)."""
    outcome: dict[str, Any] = dict(reward=i / 10.0, metrics={"len": float(i)},
                                   metadata={"note": f"n{i}", "nested": {"a": [1, 2]}})
    fields: dict[str, Any] = dict(
        episode_id=f"ep-{i}", task_id=f"t-{i // 4}", group_id=f"g-{i // 4}", group_size=4,
        category="math" if i % 2 else None, client_id="c1",
    )
    for key, value in over.items():
        (outcome if key in ("reward", "metrics", "metadata") else fields)[key] = value
    return FinishedEpisode.from_trace(_trace(i), outcome=Outcome(**outcome), **fields)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    original = _trace(5)
    record = FinishedEpisode.from_trace(
        original, episode_id="e1", task_id="t", group_id="g", group_size=2, category=None, client_id="c",
        outcome=Outcome(reward=0.5, metrics={"m": 1.0}, metadata={"k": "v"}), finished_at=123.5, group_key="g#3",
    )
    with EpisodeStore(tmp_path / "buf.db") as store:
        assert store.save_finished(record) is True
    with EpisodeStore(tmp_path / "buf.db") as store:  # a fresh connection reads what was committed
        loaded = store.get("e1")
    assert loaded is not None
    back = loaded.trace
    assert (back.merge, back.calls, back.drift_forks) == (original.merge, original.calls, original.drift_forks)
    assert original.drift_forks == 1 and len(original.timelines) == 3
    assert [t.constrained for t in original.timelines] == [[(9, 11)], [(9, 10)], []]  # the second call's tokens
    for got, want in zip(back.timelines, original.timelines, strict=True):
        assert got.tokens == want.tokens
        assert got.loss_mask == want.loss_mask
        assert got.versions == want.versions
        assert (got.temperature, got.calls) == (want.temperature, want.calls)
        assert got.constrained == want.constrained
        assert len(got.logprobs) == len(want.logprobs)
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-7)  # float32
    assert [s.tokens for s in back.samples(1.0)] == [s.tokens for s in original.samples(1.0)]
    assert (loaded.outcome, loaded.finished_at) == (Outcome(reward=0.5, metrics={"m": 1.0}, metadata={"k": "v"}), 123.5)
    assert (loaded.group_key, loaded.group, loaded.group_size) == ("g#3", "g#3", 2)


def test_wal_mode_and_compact_storage(tmp_path: Path) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        assert store.journal_mode() == "wal"
        store.save_finished(_episode(1))
    db = sqlite3.connect(tmp_path / "buf.db")
    tokens, logprobs = db.execute("SELECT tokens, logprobs FROM timelines WHERE idx=0").fetchone()
    db.close()
    assert isinstance(tokens, bytes) and isinstance(logprobs, bytes)
    assert len(logprobs) == 4 * len(_trace(1).timelines[0].logprobs)


def test_idempotent_save_and_conflict(tmp_path: Path) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        assert store.save_finished(_episode(1)) is True
        assert store.save_finished(_episode(1, finished_at=999.0)) is False  # a retried finish
        with pytest.raises(EpisodeConflict, match="different body"):
            store.save_finished(_episode(1, reward=7.0))
        assert store.get("ep-1").outcome.reward == pytest.approx(0.1)
        assert store.counts()["finished"] == 1


@pytest.mark.parametrize("bad", [
    {"reward": float("nan")},
    {"group_size": 0},
    {"episode_id": ""},
    {"metadata": {"x": object()}},
    {"metrics": {"x": float("inf")}},
])
def test_bad_records_change_nothing(tmp_path: Path, bad: dict[str, object]) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        with pytest.raises(StoreError):
            store.save_finished(_episode(1, **bad))
        assert store.counts()["finished"] == 0


def test_bad_timeline_is_refused(tmp_path: Path) -> None:
    record = _episode(1)
    record.trace.timelines[0].loss_mask.append(1)
    with EpisodeStore(tmp_path / "buf.db") as store:
        with pytest.raises(StoreError, match="lengths differ"):
            store.save_finished(record)
        assert store.get("ep-1") is None


def test_training_bookkeeping_and_rollback(tmp_path: Path) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        for i in range(8):
            store.save_finished(_episode(i))
        store.mark_trained(["ep-0", "ep-1"], step=1)
        store.mark_trained(["ep-2", "ep-3"], step=2)
        store.mark_trained(["ep-4"], step=3)
        with pytest.raises(StoreError, match="already trained"):
            store.mark_trained(["ep-0"], step=3)
        with pytest.raises(StoreError, match="rollback_after"):
            store.mark_trained(["ep-5"], step=2)
        with pytest.raises(StoreError, match="not a stored"):
            store.mark_trained(["ep-5", "nope"], step=4)
        assert store.get("ep-5") is not None and "ep-5" not in store.trained_counts()  # all-or-nothing
        assert [e.episode_id for e in store.untrained()] == ["ep-5", "ep-6", "ep-7"]

        # The server restored checkpoint step 1: steps 2 and 3 were lost with the process.
        assert store.rollback_after(1) == 3
        assert [e.episode_id for e in store.untrained()] == ["ep-2", "ep-3", "ep-4", "ep-5", "ep-6", "ep-7"]
        assert store.last_trained_step() == 1
        store.mark_trained(["ep-2", "ep-3", "ep-4", "ep-5"], step=2)
        store.mark_dropped(["ep-6"], "group below min_group_size")
        store.mark_trained(["ep-7"], step=3)
        with pytest.raises(StoreError, match="dropped"):
            store.mark_trained(["ep-6"], step=3)
        assert store.rollback_after(2) == 1  # a second restart, from checkpoint 2: ep-7 again

        live = store.trained_counts()
        assert live == {f"ep-{i}": 1 for i in (0, 1, 2, 3, 4, 5)}
        everything = store.trained_counts(include_rolled_back=True)
        assert everything["ep-2"] == 2 and everything["ep-7"] == 1 and "ep-7" not in live
        assert store.counts() == {"finished": 8, "trained": 6, "untrained": 1, "dropped": 1,
                                  "aborted": 0, "expired": 0}
        assert store.cursor() == {"last_seq": 8, "trained_step": 2}


def test_pending_groups_rebuild_group_instances_in_finish_order(tmp_path: Path) -> None:
    with EpisodeStore(tmp_path / "buf.db") as store:
        # Two instances of group "g" (the engine's g#1 and g#2) interleaved with a keyless group "h".
        plan = [("a", "g", "g#1"), ("b", "h", None), ("c", "g", "g#2"), ("d", "g", "g#1"), ("e", "h", None)]
        for i, (eid, gid, key) in enumerate(plan):
            store.save_finished(_episode(i, episode_id=eid, group_id=gid, group_key=key))
        store.mark_trained(["d"], step=1)
        groups = store.pending_groups()
        assert list(groups) == ["g#1", "h", "g#2"]
        assert {k: [e.episode_id for e in v] for k, v in groups.items()} == {"g#1": ["a"], "h": ["b", "e"], "g#2": ["c"]}


def test_closed_episodes_meta_and_events(tmp_path: Path) -> None:
    from swarm.protocol import Event

    with EpisodeStore(tmp_path / "buf.db") as store:
        store.record_closed("a", "aborted", "client crashed")
        store.record_closed("a", "aborted", "again")  # idempotent
        store.record_closed("b", "expired")
        with pytest.raises(StoreError):
            store.record_closed("c", "finished")  # type: ignore[arg-type]
        store.put_meta("policy_version_high", 12)
        for i in range(1, 6):
            store.append_event(Event(id=i, type="step.finished", time=1.0, data={"i": i}))
    with EpisodeStore(tmp_path / "buf.db") as store:
        assert store.counts()["aborted"] == 1 and store.counts()["expired"] == 1
        assert store.get_meta("policy_version_high") == 12 and store.get_meta("missing", 3) == 3
        assert store.last_event_id() == 5
        assert [e.data["i"] for e in store.recent_events(3)] == [3, 4, 5]


def test_two_threads_save_and_train_concurrently(tmp_path: Path) -> None:
    store = EpisodeStore(tmp_path / "buf.db")
    errors: list[BaseException] = []

    def saver(offset: int) -> None:
        try:
            for i in range(offset, offset + 60):
                store.save_finished(_episode(i))
                if i % 3 == 0:
                    store.counts()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=saver, args=(k * 1000,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ids = [e.episode_id for e in store.untrained()]
    assert len(ids) == 120 and len(set(ids)) == 120
    # A second connection (another store object) sees every commit.
    with EpisodeStore(tmp_path / "buf.db") as other:
        assert other.counts()["finished"] == 120
    store.close()


_WRITER = textwrap.dedent("""
    import sys
    from swarm.server.durability.store import EpisodeStore, FinishedEpisode
    from swarm.server.records.finished import Outcome
    from swarm.server.records.timeline import EpisodeTrace, Timeline
    store = EpisodeStore(sys.argv[1])
    i = 0
    while True:
        tl = Timeline(tokens=list(range(i % 50, i % 50 + 200)), loss_mask=[0] * 100 + [1] * 100,
                      logprobs=[-0.5] * 200, versions=[i], calls=1)
        store.save_finished(FinishedEpisode(
            episode_id=f"w-{i}", task_id="t", group_id=f"g-{i // 8}", group_size=8, category=None,
            client_id="writer", outcome=Outcome(reward=float(i)), trace=EpisodeTrace(timelines=[tl], calls=1)))
        print(f"w-{i}", flush=True)
        i += 1
""")


def test_sigkill_mid_write_loses_no_acknowledged_episode(tmp_path: Path) -> None:
    db = tmp_path / "buf.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(db)], stdout=subprocess.PIPE, text=True, env=env)
    acknowledged: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acknowledged.append(line.strip())
            if len(acknowledged) >= 300:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # Lines printed after our last read were acknowledged too.
        acknowledged += [line.strip() for line in proc.stdout if line.strip()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with EpisodeStore(db) as store:
        stored = {e.episode_id for e in store.untrained()}
        assert set(acknowledged) <= stored
        assert len(stored) - len(acknowledged) <= 1  # at most the one committed just before its print
        assert store.get(acknowledged[-1]).trace.timelines[0].versions == [int(acknowledged[-1][2:])]
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()
