"""``swarm events`` shows a live stream while episodes train, and the stream resumes with
``Last-Event-ID`` across a server crash and restart with the id sequence unbroken.

Real processes: a ``swarm serve`` subprocess, a client subprocess running episodes, and the
``swarm events`` CLI (``python -m swarm.cli events URL --json``) reading the stream.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from rel_harness import start_server
from support import free_port, wait_for

CLIENT = Path(__file__).with_name("rel_chaos_client.py")
CONFIG = {"group_size": 2, "min_group_size": 1, "batch_groups": 1, "max_tokens": 6, "lease_s": 5.0}


def _read_lines(proc: subprocess.Popen[str], into: list[dict]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            into.append(json.loads(line))


@pytest.mark.slow
def test_events_stream_live_and_resume_after_restart(rel_model: Path, tmp_path: Path, servers: list) -> None:
    port, token, state = free_port(), "events-token", tmp_path / "state"
    server = start_server(rel_model, state, port=port, token=token, config=CONFIG)
    servers.append(server)
    cli = subprocess.Popen([sys.executable, "-m", "swarm.cli", "events", server.url, "--token", token, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[dict] = []
    reader = threading.Thread(target=_read_lines, args=(cli, seen), daemon=True)
    reader.start()
    # The client runs until the test ends it (900 s is only a backstop against an orphan): it must
    # still be finishing episodes after the server's restart, however long the steps before take.
    client = subprocess.Popen([sys.executable, str(CLIENT), "--url", server.url, "--token", token,
                               "--log", str(tmp_path / "client.jsonl"), "--client-id", "ev", "--seconds", "900"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        types = lambda: {e["type"] for e in seen}  # noqa: E731
        wait_for(lambda: {"episode.claimed", "episode.finished", "step.started", "step.finished",
                          "weights.updated"} <= types(), 60, what="episode.* and step.* events in `swarm events`")
        ids = [e["id"] for e in seen]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        cli.kill()
        cli.wait()
        last_seen = seen[-1]["id"]
        server.kill()                                  # crash; events up to the kill were persisted
        server = start_server(rel_model, state, port=port, token=token, config=CONFIG)
        servers.append(server)
        resumed: list[dict] = []
        with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
            with http.stream("GET", "/api/v1/events", params={"timeout_s": 20, "max_events": 400},
                             headers={"Last-Event-ID": str(last_seen)}) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        resumed.append(json.loads(line[5:]))
                        if any(e["type"] == "episode.finished" and e["id"] > first_new(resumed) for e in resumed):
                            break
    finally:
        for proc in (cli, client):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    resumed_ids = [e["id"] for e in resumed]
    # The sequence continues exactly after the last id the reader saw: nothing skipped, nothing repeated.
    assert resumed_ids == list(range(last_seen + 1, last_seen + 1 + len(resumed_ids)))
    assert any(e["type"] == "server.started" for e in resumed)


def first_new(events: list[dict]) -> int:
    """Id of the restarted server's ``server.started`` event (events before it were replayed)."""
    starts = [e["id"] for e in events if e["type"] == "server.started"]
    return starts[-1] if starts else 1 << 62
