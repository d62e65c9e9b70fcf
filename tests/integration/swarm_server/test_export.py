"""``swarm export``: a live server's episodes (a real tiny server on loopback, real trained steps) read
back from Parquet with ``datasets`` and pandas and from JSON Lines, token for token as the store holds
them; ``--since-step`` filters; bad input is a clear exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from datasets import Dataset
from server_harness import RunningServer
from support import wait_for
from typer.testing import CliRunner

from swarm.cli import app
from swarm.server.durability.store import EpisodeStore

CONFIG = {"group_size": 1, "min_group_size": 1, "batch_groups": 1, "max_staleness": 64, "max_tokens": 4,
          "retention": "all"}


def _claim(server: RunningServer, task: str) -> dict:
    with server.client() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _chat(server: RunningServer, episode: dict, messages: list[dict]) -> str:
    with server.client(episode["api_key"]) as http:
        response = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4})
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"] or "")


def _finish(server: RunningServer, episode: dict, reward: float) -> None:
    with server.client(episode["api_key"]) as http:
        response = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": reward})
    assert response.status_code == 200, response.text


def _export(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["export", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_export_while_serving_round_trips_token_ids(start_server, tmp_path: Path) -> None:
    server = start_server(**CONFIG)
    first = _claim(server, "a")
    _chat(server, first, [{"role": "user", "content": "say a"}])
    _finish(server, first, 1.0)
    wait_for(lambda: server.status()["step"] == 1)
    second = _claim(server, "b")  # two calls, the second extending the first: one merged timeline
    reply = _chat(server, second, [{"role": "user", "content": "say b"}])
    _chat(server, second, [{"role": "user", "content": "say b"}, {"role": "assistant", "content": reply},
                           {"role": "user", "content": "again"}])
    _finish(server, second, 0.5)
    wait_for(lambda: server.status()["step"] == 2)
    with server.client() as http:
        assert http.post("/api/v1/control/checkpoint").status_code == 200
        http.patch("/api/v1/config", json={"values": {"batch_groups": 3}})
    pending = _claim(server, "c")  # stays untrained
    _chat(server, pending, [{"role": "user", "content": "say c"}])
    _finish(server, pending, 0.0)
    wait_for(lambda: server.status()["episodes"]["finished"] == 3)

    parquet, jsonl, recent = tmp_path / "out" / "episodes.parquet", tmp_path / "episodes.jsonl", tmp_path / "r.jsonl"
    state = str(server.state_dir)
    code, output = _export("--state-dir", state, "--out", str(parquet))  # beside the live server
    assert code == 0, output
    assert _export("--state-dir", state, "--out", str(jsonl), "--format", "jsonl", "--tokenizer", "none")[0] == 0
    assert _export("--state-dir", state, "--out", str(recent), "--format", "jsonl", "--since-step", "2")[0] == 0
    server.stop()
    assert sorted(p.name for p in parquet.parent.iterdir()) == ["episodes.parquet"]  # no temporary left

    with EpisodeStore(server.state_dir / "buffer.db") as store:
        stored = {e.episode_id: e for e in (store.get(x["episode_id"]) for x in (first, second, pending)) if e}
        steps = {e: s for s, e, _ in store.training_log()}
    assert len(stored) == 3
    rows = Dataset.from_parquet(str(parquet)).to_list()
    frame = pd.read_parquet(parquet)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["episode_id"] for r in rows] == list(frame["episode_id"]) == [r["episode_id"] for r in lines] \
        == [first["episode_id"], second["episode_id"], pending["episode_id"]]
    for row, line in zip(rows, lines, strict=True):
        episode = stored[row["episode_id"]]
        assert row["trained_step"] == line["trained_step"] == steps.get(row["episode_id"])
        assert row["reward"] == line["reward"] == episode.outcome.reward
        for source in (row, line):
            assert [t["tokens"] for t in source["timelines"]] == [t.tokens for t in episode.trace.timelines]
            assert [t["loss_mask"] for t in source["timelines"]] == [t.loss_mask for t in episode.trace.timelines]
            assert [t["versions"] for t in source["timelines"]] == [t.versions for t in episode.trace.timelines]
            assert [t["logprobs"] for t in source["timelines"]] == [t.logprobs for t in episode.trace.timelines]
            timeline = episode.trace.timelines[0]
            start = timeline.loss_mask.index(1)
            assert source["prompt_token_ids"] == timeline.tokens[:start]
            assert source["completion_token_ids"] == timeline.tokens[start:]
            assert source["policy_versions"] == sorted(set(timeline.versions))
    merged = stored[second["episode_id"]]
    assert len(merged.trace.timelines) == 1 and merged.trace.timelines[0].calls == 2  # the multi-call episode, merged
    assert rows[2]["trained_step"] is None and lines[2]["trained_step"] is None
    assert rows[0]["prompt_text"] and "say a" in rows[0]["prompt_text"]  # the checkpoint's tokenizer decoded it
    assert lines[0]["prompt_text"] is None  # --tokenizer none: token ids only
    assert [json.loads(line)["episode_id"] for line in recent.read_text().splitlines()] == [second["episode_id"]]


def test_export_refuses_bad_input(tmp_path: Path) -> None:
    code, output = _export("--state-dir", str(tmp_path / "absent"), "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "no state dir" in output
    code, output = _export("--state-dir", str(tmp_path), "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "no episode buffer" in output
    code, output = _export("--state-dir", str(tmp_path), "--out", str(tmp_path / "x.csv"), "--format", "csv")
    assert code == 2 and "unknown --format" in output
    (tmp_path / "buffer.db").write_bytes(b"not a database at all" * 100)
    code, output = _export("--state-dir", str(tmp_path), "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "not a readable swarm buffer" in output
    assert not (tmp_path / "x.parquet").exists()
