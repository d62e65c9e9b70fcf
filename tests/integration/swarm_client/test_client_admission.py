"""Admission end to end (issue 35): one client far above the staleness bound's capacity trains on
almost everything it generates, because the server refuses (429 + ``Retry-After``) the work that
could not train within ``max_staleness`` instead of dropping it at the step.

A real ``swarm serve`` process (tiny model) with ``max_staleness = 1`` and 8 episodes a step; one
``SwarmClient.run`` with 64 episodes in flight, eight times a batch, plus held-out rounds. The
client's transport logs every refusal it waits out (the server's error, with its ``retry_after``);
the test counts those against the server's ``refused_stale``. Without admission the same client
drops most of what reaches a step as stale (the control run).
"""

from __future__ import annotations

import logging
import random
import string
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ServeProcess

from swarm.client import EpisodeHandle, RunSummary, SwarmClient, SwarmHTTPError

CONFIG = """
group_size = 4
batch_groups = 2
min_group_size = 2
max_tokens = 8
temperature = 1.0
mode = "async"
max_staleness = 1
"""
CONCURRENCY = 64  # eight batches in flight, where max_staleness = 1 leaves room for two
EPISODES = 320


def _tasks(seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    for index in range(10**6):
        yield {"task_id": f"adm-{index}", "prompt": "".join(rng.choice(string.ascii_lowercase) for _ in range(8))}


def _workflow(ep: EpisodeHandle, task: dict) -> float:
    reply = ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                                max_tokens=8, temperature=1.0)
    return (reply.choices[0].message.content or "").count("a") / 8


def _run(server: ServeProcess, label: str) -> tuple[dict, RunSummary]:
    """Run the client to ``EPISODES`` (none may fail); the server's status after, and the run's summary."""
    heldout = [{"task_id": f"held-{i}", "prompt": "abcdefgh"} for i in range(4)]
    with SwarmClient(server.url, token=server.token, retry_for_s=60) as client:
        summary = client.run(_tasks(0), _workflow, group_size=4, concurrency=CONCURRENCY, episodes=EPISODES,
                             progress=False, heldout=heldout, eval_every=5)
    assert summary.finished == EPISODES and summary.aborted == 0, summary
    status = server.status()
    episodes = status["episodes"]
    print(f"{label}: {episodes['finished']} finished, {episodes['trained']} trained, {episodes['dropped']} dropped, "
          f"{episodes['refused_stale']} refused, {status['step']} steps in {summary.seconds:.1f} s")
    return status, summary


def test_one_client_far_above_capacity_trains_what_it_generates(
        new_server: Callable[..., ServeProcess], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    caplog.set_level(logging.DEBUG, logger="swarm.client._transport")
    status, summary = _run(new_server(config=config), "admission")
    episodes = status["episodes"]
    assert summary.eval_rounds >= 2, summary  # held-out rounds ran although training claims were refused
    # Every refusal the client waited out was a 429 with a retry_after; the server counted each one.
    waits = [r.args[2] for r in caplog.records if r.name == "swarm.client._transport" and len(r.args) == 4
             and isinstance(r.args[2], SwarmHTTPError)]
    refused = [e for e in waits if (e.detail or {}).get("reason") in status["refusal_reasons"]]
    assert refused and all(e.status == 429 and e.retry_after and e.retry_after > 0 for e in refused)
    assert len(refused) == sum(status["refusal_reasons"].values()) == episodes["refused_stale"]
    # ... and almost nothing generated was thrown away.
    assert episodes["finished"] == EPISODES and episodes["dropped"] <= 0.05 * episodes["finished"], status
    assert episodes["dropped_stale"] == episodes["dropped"] - sum(
        n for reason, n in status["drop_reasons"].items() if not reason.startswith("older than max_staleness"))
    assert status["step"] >= 30, status

    # The control: the same client without admission throws most of what reached a step away as stale
    # (many of its episodes still wait when it ends: it outruns the learner).
    control = tmp_path / "control.toml"
    control.write_text(CONFIG + "admission = false\n")
    status, _ = _run(new_server(config=control), "no admission")
    assert status["episodes"]["refused_stale"] == 0
    assert status["episodes"]["dropped_stale"] > status["episodes"]["trained"], status
