"""Retention (``swarm.server.durability.retention``): after real checkpoints a server prunes exactly the episodes no kept
checkpoint can train again (exported first when asked), each leaving its record in the pruned ledger
(``swarm.server.durability.store_pruned``), and a restart from its oldest kept checkpoint still finds, and trains
once, every episode it rolled back; an audit finds every acknowledged id stored or pruned, trained once.
Store-level cases use a real store and real checkpoint directories."""

from __future__ import annotations

import json
import shutil
import sqlite3
import uuid
from pathlib import Path

import pandas as pd
from server_harness import RunningServer
from support import wait_for

from swarm.config import ServerConfig
from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.retention import enforce_retention, safe_step
from swarm.server.durability.store import PRUNED_KEY, EpisodeStore, StoreError
from swarm.server.durability.store_schema import SCHEMA_VERSION
from swarm.server.records.finished import FinishedEpisode, Outcome
from swarm.server.records.timeline import EpisodeTrace, Timeline

CONFIG = {"group_size": 1, "min_group_size": 1, "batch_groups": 1, "max_staleness": 64, "max_tokens": 4,
          "checkpoint_every": 1, "retention_export_dir": "exported"}


def _play(server: RunningServer, task: str, reward: float = 1.0) -> dict:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": task}).json()
    with server.client(episode["api_key"]) as http:
        assert http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": f"say {task}"}],
                                                       "max_tokens": 4}).status_code == 200
        response = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward})
    assert response.status_code == 200, response.text
    return dict(episode)


def _mark(state: Path) -> int:
    with sqlite3.connect(f"{(state / 'buffer.db').as_uri()}?mode=ro", uri=True) as db:
        row = db.execute("SELECT value FROM meta WHERE key=?", (PRUNED_KEY,)).fetchone()
    return int(json.loads(row[0])) if row else 0


def test_since_checkpoint_drops_only_what_no_restart_needs(start_server, tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_server(state_dir=state, **CONFIG)  # retention: the default, since_checkpoint
    episodes = []
    for n in range(1, 6):
        episodes.append(_play(server, f"t{n}"))
        wait_for(lambda n=n: server.status()["step"] == n)
    wait_for(lambda: _mark(state) == 3, what="retention after the step-5 checkpoint")  # kept: steps 3, 4, 5
    with server.client() as http:
        http.patch("/api/v1/config", json={"values": {"batch_groups": 3}})
    pending = _play(server, "p")  # untrained: never touched
    first = episodes[0]
    with server.client(first["api_key"]) as http:  # a retried finish of a pruned episode is still a no-op
        for reward in (1.0, 0.5):  # its body is gone with its row: any body is accepted, nothing is stored
            answer = http.post(f"/api/v1/episodes/{first['episode_id']}/finish", json={"reward": reward})
            assert answer.status_code == 200 and answer.json()["state"] == "finished", answer.text
            assert answer.json()["reward"] is None
    server.stop()

    ids = [e["episode_id"] for e in episodes]
    with EpisodeStore(state / "buffer.db") as store:
        traces = {e: store.get(e) for e in [*ids, pending["episode_id"]]}
        counts = store.counts()
        ledger = store.pruned_steps()
        logged = {e for _, e, _ in store.training_log()}
    assert [traces[e] is None for e in ids] == [True, True, True, False, False]  # rows and traces gone
    assert [len(traces[e].trace.timelines) for e in ids[3:]] == [1, 1]  # type: ignore[union-attr]
    assert len(traces[pending["episode_id"]].trace.timelines) == 1  # type: ignore[union-attr]
    assert ledger == {ids[0]: 1, ids[1]: 2, ids[2]: 3} and logged == set(ids[3:])
    assert counts["finished"] == 6 and counts["trained"] == 5 and counts["dropped"] == 0
    exported = sorted((state / "exported").iterdir())
    assert [p.name for p in exported] == [f"episodes-steps-{n}-{n}.parquet" for n in (1, 2, 3)]
    frame = pd.concat([pd.read_parquet(p) for p in exported])
    assert list(frame["episode_id"]) == [e["episode_id"] for e in episodes[:3]]
    assert all(len(t) == 1 and len(t[0]["tokens"]) > 0 for t in frame["timelines"])  # the traces, before the drop

    # The two newest checkpoints do not load: the restart resumes from the oldest kept one (step 3)
    # and trains steps 4 and 5's episodes again, with their traces, plus the pending one.
    for step in (4, 5):
        shutil.rmtree(state / "checkpoints" / f"step-{step}")
    server = start_server(state_dir=state, **CONFIG)
    assert server.status()["episodes"]["finished"] == 6  # the three pruned ones count, from the ledger
    wait_for(lambda: server.status()["step"] == 4)  # resumed at step 3; the three restored groups, one batch
    server.stop()
    acknowledged = [*ids, pending["episode_id"]]
    with EpisodeStore(state / "buffer.db") as store:
        trained = store.trained_counts()
        rolled_back = {step for step, _, flagged in store.training_log() if flagged}
        samples = [store.get(e) for e in acknowledged[3:]]
        unaccounted = [e for e in acknowledged if not store.known(e)]
        assert store.cursor() == {"last_seq": 6, "trained_step": 4}
    assert not unaccounted and trained == dict.fromkeys(acknowledged, 1)  # every finish: stored or pruned, once
    assert rolled_back == {4, 5}  # resumed from step 3: steps 4 and 5 trained again
    assert all(s is not None and len(s.trace.timelines) == 1 for s in samples)


def _episode(n: int, episode_id: str | None = None) -> FinishedEpisode:
    timeline = Timeline(tokens=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[0], calls=1)
    return FinishedEpisode(episode_id=episode_id or f"e{n}", task_id="t", group_id=f"g{n}", group_size=1, category=None,
                           client_id="c", outcome=Outcome(reward=1.0), trace=EpisodeTrace(timelines=[timeline]))


def _checkpoint(checkpoints: CheckpointManager, step: int) -> None:
    checkpoints.save(step, step, lambda d: (d / "w").write_text("w"), {})


def test_retention_all_keeps_everything_and_rollback_below_the_mark_drops(tmp_path: Path) -> None:
    checkpoints = CheckpointManager(tmp_path / "checkpoints", keep=1)
    with EpisodeStore(tmp_path / "buffer.db") as store:
        for n in (1, 2, 3):
            store.save_finished(_episode(n))
            store.mark_trained([f"e{n}"], n)
            _checkpoint(checkpoints, n)
        assert safe_step(checkpoints) == 3
        assert enforce_retention(store, checkpoints, ServerConfig(retention="all"), tmp_path) is None
        assert all(len(store.get(f"e{n}").trace.timelines) == 1 for n in (1, 2, 3))  # type: ignore[union-attr]
        pruned = enforce_retention(store, checkpoints, ServerConfig(), tmp_path)
        assert pruned is not None and (pruned.after, pruned.through, pruned.episodes, pruned.timelines) == (0, 3, 3, 3)
        assert enforce_retention(store, checkpoints, ServerConfig(), tmp_path) is None  # nothing new to drop
        assert [store.get(f"e{n}") for n in (1, 2, 3)] == [None] * 3 and store.training_log() == []
        assert all(store.known(f"e{n}") for n in (1, 2, 3)) and not store.known("e4")
        assert store.trained_counts() == {"e1": 1, "e2": 1, "e3": 1}
        assert store.counts()["finished"] == store.counts()["trained"] == 3
        assert store.last_trained_step() == 3 and store.cursor() == {"last_seq": 3, "trained_step": 3}
        store.save_finished(_episode(4))
        try:  # the pruned steps still count as live: no step may go below them
            store.mark_trained(["e4"], 2)
            raise AssertionError("marked a step older than the pruned ones")
        except StoreError as exc:
            assert "older than live step 3" in str(exc)
        assert store.save_finished(_episode(1)) is False  # a pruned id is never stored again
        # Every kept checkpoint lost (a restart from scratch): pruned episodes cannot train again.
        store.rollback_after(1)
        assert store.drop_reasons() == {"trace pruned": 2}
        assert store.pruned_steps() == {"e1": 1, "e2": None, "e3": None}
        assert store.trained_counts() == {"e1": 1} and store.last_trained_step() == 1
        counts = store.counts()
        assert (counts["finished"], counts["trained"], counts["dropped"], counts["untrained"]) == (4, 1, 2, 1)
        assert [e.episode_id for e in store.untrained()] == ["e4"] and store.get_meta(PRUNED_KEY) == 1


def test_ledger_keys_server_ids_compactly_and_old_buffers_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    with EpisodeStore(path) as store:  # make it a version-1 buffer: no ledger yet
        pass
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE pruned")
        db.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    served = uuid.uuid4().hex
    with EpisodeStore(path) as store:  # upgraded in place
        assert store.get_meta("schema_version") == SCHEMA_VERSION
        store.save_finished(_episode(1, served))
        store.save_finished(_episode(2))
        store.commit_step(1, [served, "e2"])
        assert store.prune(1) == (2, 2)
        assert store.pruned_steps() == {served: 1, "e2": 1} and store.known(served)
    with sqlite3.connect(path) as db:
        keys = {type(key): key for (key,) in db.execute("SELECT key FROM pruned")}
    assert keys == {bytes: bytes.fromhex(served), str: "e2"}  # a server-made id takes 16 bytes


def test_step_rows_in_memory_stay_bounded_and_every_row_is_served_across_a_restart(
        start_server, tmp_path: Path, monkeypatch) -> None:
    """Days of steps must not grow the server's memory: it holds the newest rows (3 here), and
    ``GET /metrics`` still serves every row from the buffer, before and after a restart. A held-out
    round ending for a step older than memory holds merges into that step's stored row."""
    from swarm.server.training import step_rows

    monkeypatch.setattr(step_rows, "IN_MEMORY", 3)
    state = tmp_path / "state"
    config = {**CONFIG, "retention": "all"}
    server = start_server(state_dir=state, **config)
    for n in range(1, 7):
        _play(server, f"t{n}")
        wait_for(lambda n=n: server.status()["step"] == n)

    def served(running: RunningServer, since: int) -> list[int]:
        with running.client() as http:
            return [row["step"] for row in http.get("/api/v1/metrics", params={"since_step": since}).json()]

    assert [m.step for m in server.core.metrics] == [4, 5, 6]
    assert served(server, 0) == [1, 2, 3, 4, 5, 6] and served(server, 2) == [3, 4, 5, 6] and served(server, 5) == [6]
    server.core.rows.add(1, {"eval/reward_mean": 0.5})  # an old step's held-out round ends
    assert [m.step for m in server.core.metrics] == [4, 5, 6]
    server.stop()

    restarted = start_server(state_dir=state, **config)
    assert [m.step for m in restarted.core.metrics] == [4, 5, 6]
    with restarted.client() as http:
        rows = http.get("/api/v1/metrics", params={"since_step": 0}).json()
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["metrics"]["eval/reward_mean"] == 0.5 and "train/episodes_total" in rows[0]["metrics"]
    assert rows[0]["metrics"]["eval/episodes_total"] == rows[0]["metrics"]["train/episodes_total"]  # the round's x
