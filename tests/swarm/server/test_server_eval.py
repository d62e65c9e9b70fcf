"""Held-out evaluation (issue #16): eval episodes through a real server and a real ``SwarmClient.run``.

An eval episode (``purpose="eval"``) is served with a fixed seed per call, never recorded, grouped,
stored, counted or trained; a training step waits for the live eval round, and the next committed
step reports the round as ``eval/*`` metrics on every metric path (``/api/v1/metrics`` and the
durable buffer the MLflow writer reads). The pure parts (the round book, the seed) are tested here too.
"""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError
from server_harness import RunningServer, wait_for

from swarm.client import EpisodeHandle, SwarmClient
from swarm.protocol import ClaimRequest
from swarm.server.completions import eval_seed
from swarm.server.episodes import EvalBook

MESSAGES = [{"role": "user", "content": "say a"}]


def _claim(server: RunningServer, task: str, **extra) -> dict:
    with server.client() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def _chat(server: RunningServer, episode: dict) -> dict:
    with server.client(episode["api_key"]) as http:
        response = http.post("/v1/chat/completions",
                             json={"messages": MESSAGES, "max_tokens": 8, "temperature": 1.0})
    assert response.status_code == 200, response.text
    return response.json()


def _end(server: RunningServer, episode: dict, action: str, body: dict) -> httpx.Response:
    with server.client(episode["api_key"]) as http:
        return http.post(f"/api/v1/episodes/{episode['episode_id']}/{action}", json=body)


def _status(server: RunningServer) -> dict:
    with server.client() as http:
        return http.get("/api/v1/status").json()


def _metrics(server: RunningServer) -> list[dict]:
    with server.client() as http:
        return http.get("/api/v1/metrics").json()


def test_eval_episodes_are_served_reproducibly_never_trained_and_reported_with_the_next_step(
        start_server) -> None:
    server = start_server(group_size=2, min_group_size=2, batch_groups=1)
    engine = server.engine
    with server.client() as http:  # grouping an eval episode is refused, and nothing changes
        refused = http.post("/api/v1/episodes", json={"task_id": "h0", "purpose": "eval", "group_id": "g"})
    assert refused.status_code == 422 and "never grouped" in refused.text
    assert engine.evals.live == 0 and _status(server)["episodes"]["claimed"] == 0

    first, second = _claim(server, "h0", purpose="eval"), _claim(server, "h0", purpose="eval")
    other, lost = _claim(server, "h1", purpose="eval"), _claim(server, "h2", purpose="eval", lease_s=0.3)
    assert first["purpose"] == "eval" and first["step"] == 0 and first["policy_version"] == 0
    # The same held-out task under the same policy gets the same sampled reply (a fixed seed per call).
    replies = [_chat(server, ep)["choices"][0]["token_ids"] for ep in (first, second, other)]
    assert replies[0] == replies[1] and replies[0] != replies[2]

    a, b = _claim(server, "t1"), _claim(server, "t1")
    assert a["purpose"] == "train" and a["step"] == 0
    for ep in (a, b):
        _chat(server, ep)
    for ep, reward in ((a, 0.0), (b, 1.0)):
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    # The group is ready, but a step waits while the eval round is live: it evaluates one policy.
    assert engine.groups.ready and not engine.can_step() and engine.step == 0

    for ep, reward in ((first, 0.25), (second, 0.25), (other, 1.0)):
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    assert _end(server, first, "finish", {"reward": 0.25}).status_code == 200  # a retried finish: no-op
    assert _end(server, first, "finish", {"reward": 0.5}).status_code == 409  # a finish is final
    wait_for(lambda: engine.evals.live == 0)  # the short-leased one expires without a reward
    wait_for(lambda: engine.step == 1)

    [step] = _metrics(server)
    m = step["metrics"]
    assert m["eval/step"] == 0 and m["eval/episodes"] == 3
    assert m["eval/reward_mean"] == pytest.approx(0.5) and m["eval/reward_std"] == pytest.approx(0.3535534)
    assert m["train/episodes"] == 2 and m["train/reward_mean"] == 0.5  # evals neither trained nor mixed in
    # The durable buffer (what the MLflow writer logs) holds the same step metrics; no eval episode.
    [stored] = [json.loads(body) for body in engine.store.step_metrics()]
    assert stored["metrics"]["eval/reward_mean"] == pytest.approx(0.5)
    assert all(engine.store.get(ep["episode_id"]) is None for ep in (first, second, other, lost))
    assert engine.store.get(a["episode_id"]) is not None
    counts = _status(server)["episodes"]  # the buffer counts are training's only
    assert counts["claimed"] == 2 and counts["finished"] == 2 and counts["trained"] == 2
    assert counts["expired"] == 0 and counts["aborted"] == 0

    # An eval claimed now evaluates the step-1 policy; the next step reports nothing without one.
    later = _claim(server, "h0", purpose="eval")
    assert later["step"] == 1 and later["policy_version"] == 1
    assert _end(server, later, "abort", {"reason": "test"}).status_code == 200
    c, d = _claim(server, "t2"), _claim(server, "t2")
    for ep in (c, d):
        _chat(server, ep)
        assert _end(server, ep, "finish", {"reward": 0.5}).status_code == 200
    wait_for(lambda: engine.step == 2)
    assert not any(key.startswith("eval/") for key in _metrics(server)[-1]["metrics"])
    assert _status(server)["episodes"]["aborted"] == 0


def test_run_evaluates_the_heldout_set_at_step_zero_and_every_n_steps(start_server) -> None:
    # Sync mode: the step waits for its drain, and eval claims must still get in (no deadlock).
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, max_tokens=4, mode="sync")
    heldout = [{"task_id": f"held-{i}", "prompt": "held"} for i in range(3)]
    seen: list[tuple[str, str]] = []

    def workflow(ep: EpisodeHandle, task: dict) -> float:
        ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=4)
        seen.append((ep.episode.purpose, task["task_id"]))
        return 0.5 if ep.episode.purpose == "eval" else float(len(seen) % 2)

    tasks = ({"task_id": f"t{i}"} for i in range(8))
    with SwarmClient(server.url, token=server.token) as client:
        summary = client.run(tasks, workflow, group_size=2, concurrency=4, progress=False, heldout=heldout,
                             eval_every=2)
        wait_for(lambda: client.status().step == 8)
        metrics = client.metrics()
    assert summary.finished == 16 and summary.aborted == 0  # training's own count, evals apart
    assert summary.eval_rounds >= 2 and summary.eval_finished == 3 * summary.eval_rounds
    assert sum(purpose == "eval" for purpose, _ in seen) == 3 * summary.eval_rounds
    evals = [m.metrics for m in metrics if "eval/step" in m.metrics]
    steps = [int(m["eval/step"]) for m in evals]
    assert steps[0] == 0 and steps == sorted(set(steps)) and len(steps) >= 2
    assert all(m["eval/episodes"] == 3 and m["eval/reward_mean"] == 0.5 for m in evals)
    assert all(m.metrics["train/episodes"] == 2 for m in metrics)
    assert server.engine.counts.finished == 16 and server.engine.evals.live == 0

    with pytest.raises(ValueError, match="appears twice"):
        client.run(iter([]), workflow, group_size=2, concurrency=1, heldout=heldout + heldout[:1], eval_every=1)


def test_eval_book_reports_finished_rounds_oldest_first() -> None:
    book = EvalBook()
    for step in (0, 0, 5):
        book.claimed(step)
    assert book.ended(0, 1.0) is None and book.live == 2
    assert book.take_finished() == {}  # round 0 still has a live episode
    finished = book.ended(0, None)  # an aborted episode leaves no reward
    assert finished is not None and finished.rewards == [1.0]
    assert book.ended(5, 0.0) is not None
    assert book.take_finished() == {"eval/reward_mean": 1.0, "eval/reward_std": 0.0, "eval/episodes": 1.0,
                                    "eval/step": 0.0}
    assert book.take_finished()["eval/step"] == 5.0 and book.take_finished() == {}
    book.claimed(7)
    book.ended(7, None)
    assert book.take_finished() == {}  # a round whose every episode failed reports nothing


def test_eval_seed_is_fixed_per_task_and_call_and_fits_int64_with_n() -> None:
    assert eval_seed("held-0", 0) == eval_seed("held-0", 0)
    assert len({eval_seed("held-0", 0), eval_seed("held-0", 1), eval_seed("held-1", 0)}) == 3
    assert all(0 <= eval_seed(f"t{i}", i) <= 2**62 for i in range(100))
    with pytest.raises(ValidationError, match="never grouped"):
        ClaimRequest(task_id="h", purpose="eval", group_size=4)
    with pytest.raises(ValidationError):
        ClaimRequest(task_id="h", purpose="test")
