"""Held-out evaluation (issue #16): eval episodes through a real server and a real ``SwarmClient.run``.

An eval episode (``purpose="eval"``) is served with a fixed seed per call, never recorded, grouped,
stored, counted or trained; a training step waits for the live eval round, and the round's ``eval/*``
metrics join the row of the step it evaluated the moment it ends (row 0: the untrained policy), on
every metric path: ``/api/v1/metrics``, the durable buffer (so a restart keeps them) and the server's
MLflow run, also when the round ends after the run's last step. The pure parts (the round book, the
seed) are tested here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from pydantic import ValidationError
from server_harness import RunningServer
from support import wait_for

from swarm.client import EpisodeHandle, SwarmClient
from swarm.protocol import ClaimRequest
from swarm.server.episodes.completions import eval_seed
from swarm.server.episodes.evaluation import EvalBook

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


def _metrics(server: RunningServer, since_step: int = 0) -> list[dict]:
    with server.client() as http:
        return http.get("/api/v1/metrics", params={"since_step": since_step}).json()


def test_eval_episodes_are_served_reproducibly_never_trained_and_reported_when_their_round_ends(
        start_server) -> None:
    server = start_server(group_size=2, min_group_size=2, batch_groups=1)
    core = server.core
    with server.client() as http:  # grouping an eval episode is refused, and nothing changes
        refused = http.post("/api/v1/episodes", json={"task_id": "h0", "purpose": "eval", "group_id": "g"})
    assert refused.status_code == 422 and "never grouped" in refused.text
    assert core.evals.live == 0 and _status(server)["episodes"]["claimed"] == 0

    first, second = _claim(server, "h0", purpose="eval"), _claim(server, "h0", purpose="eval")
    other, lost = _claim(server, "h1", purpose="eval"), _claim(server, "h2", purpose="eval", lease_s=0.3)
    assert first["purpose"] == "eval" and first["step"] == 0 and first["policy_version"] == 0
    # A task's second episode in a round is its second sample: its own noise (``--eval-samples``).
    replies = [_chat(server, ep)["choices"][0]["token_ids"] for ep in (first, second, other)]
    assert len({tuple(r) for r in replies}) == 3

    a, b = _claim(server, "t1"), _claim(server, "t1")
    assert a["purpose"] == "train" and a["step"] == 0
    for ep in (a, b):
        _chat(server, ep)
    for ep, reward in ((a, 0.0), (b, 1.0)):
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    # The group is ready, but a step waits while the eval round is live: it evaluates one policy.
    assert core.groups.ready and not core.loop.can_step() and core.step == 0

    for ep, reward in ((first, 0.25), (second, 0.75), (other, 1.0)):
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    assert _end(server, first, "finish", {"reward": 0.25}).status_code == 200  # a retried finish: no-op
    assert _end(server, first, "finish", {"reward": 0.5}).status_code == 409  # a finish is final
    wait_for(lambda: core.evals.live == 0)  # the short-leased one expires without a reward
    wait_for(lambda: core.step == 1)

    # The round evaluated the untrained policy: row 0, eval/* only; the step's row has no eval/*.
    baseline, step = _metrics(server)
    m = baseline["metrics"]
    assert baseline["step"] == 0 and set(m) == {"eval/reward_mean", "eval/reward_std", "eval/episodes", "eval/step",
                                                "eval/episodes_total", "eval/reward_mean_sd"}
    assert m["eval/step"] == 0 and m["eval/episodes"] == 3 and m["eval/episodes_total"] == 0  # none trained yet
    assert m["eval/reward_mean"] == pytest.approx(2 / 3) and m["eval/reward_std"] == pytest.approx(0.3118048)
    # h0's two samples (0.25, 0.75) give the within-task variance 0.125: the round's sampling sd sqrt(0.125 / 3).
    assert m["eval/reward_mean_sd"] == pytest.approx((0.125 / 3) ** 0.5)
    assert step["step"] == 1 and not any(key.startswith("eval/") for key in step["metrics"])
    assert step["metrics"]["train/episodes"] == 2 and step["metrics"]["train/reward_mean"] == 0.5
    assert [s["step"] for s in _metrics(server, since_step=1)] == []  # since a step: the steps after it
    # The durable buffer (what the MLflow writer logs) holds the same rows; no eval episode.
    stored = [json.loads(body) for body in core.store.step_metrics(-1)]
    assert [s["metrics"] for s in stored] == [baseline["metrics"], step["metrics"]]
    assert all(core.store.get(ep["episode_id"]) is None for ep in (first, second, other, lost))
    assert core.store.get(a["episode_id"]) is not None
    counts = _status(server)["episodes"]  # the buffer counts are training's only
    assert counts["claimed"] == 2 and counts["finished"] == 2 and counts["trained"] == 2
    assert counts["expired"] == 0 and counts["aborted"] == 0

    # An eval claimed now evaluates the step-1 policy; a round with no reward publishes nothing.
    later = _claim(server, "h0", purpose="eval")
    assert later["step"] == 1 and later["policy_version"] == 1
    assert _end(server, later, "abort", {"reason": "test"}).status_code == 200
    c, d = _claim(server, "t2"), _claim(server, "t2")
    for ep in (c, d):
        _chat(server, ep)
        assert _end(server, ep, "finish", {"reward": 0.5}).status_code == 200
    wait_for(lambda: core.step == 2)
    assert not any(key.startswith("eval/") for key in _metrics(server)[-1]["metrics"])
    assert _status(server)["episodes"]["aborted"] == 0


def test_run_evaluates_the_heldout_set_at_step_zero_and_every_n_steps(start_server, tmp_path: Path) -> None:
    """Sync mode: the step waits for its drain, and eval claims must still get in (no deadlock). In the
    server's MLflow run each round's ``eval/episodes_total`` (the x of a chart per episode consumed) is
    logged at exactly the steps of ``eval/reward_mean`` with the episodes trained through that step:
    MLflow's UI pairs a chart's x and y by position in their histories, not by step."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, max_tokens=4, mode="sync", mlflow_uri=uri)
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
    assert steps[0] == 0 and steps == sorted(set(steps)) and len(steps) == summary.eval_rounds >= 2
    assert all(s % 2 == 0 for s in steps), steps  # aligned: the step after each multiple waits for its round
    assert all(int(m.metrics["eval/step"]) == m.step for m in metrics if "eval/step" in m.metrics)
    assert all(m["eval/episodes"] == 3 and m["eval/reward_mean"] == 0.5 for m in evals)
    assert [m.step for m in metrics] == list(range(9))  # row 0: the untrained policy's evaluation
    assert all(m.metrics["train/episodes"] == 2 for m in metrics[1:])
    assert [m.metrics["train/episodes_total"] for m in metrics[1:]] == [2.0 * s for s in range(1, 9)]
    assert server.core.counts.finished == 16 and server.core.evals.live == 0

    recorded = {m.step: m.metrics.get("train/episodes_total", 0.0) for m in metrics}  # row 0: none trained
    cursor = server.state_dir / "mlflow.json"
    wait_for(lambda: cursor.is_file() and json.loads(cursor.read_text())["delivered_step"] == 8, 120,
             what="the run's rows to reach MLflow", interval=0.2)
    mlflow, run_id = MlflowClient(tracking_uri=uri), json.loads(cursor.read_text())["run_id"]
    y = sorted(mlflow.get_metric_history(run_id, "eval/reward_mean"), key=lambda m: m.step)
    x = sorted(mlflow.get_metric_history(run_id, "eval/episodes_total"), key=lambda m: m.step)
    assert [m.step for m in y] == [m.step for m in x] == steps
    assert [m.value for m in x] == [recorded[s] for s in steps] == [2.0 * s for s in steps]

    with pytest.raises(ValueError, match="appears twice"):
        client.run(iter([]), workflow, group_size=2, concurrency=1, heldout=heldout + heldout[:1], eval_every=1)


def test_a_sync_drain_refusal_names_the_step_whose_round_the_next_step_waits_for(start_server) -> None:
    """Sync mode, the next batch already complete when a step ends: every training claim is refused (the
    drain) while the next step holds for this step's held-out round. The refusal names the step, as
    admission's does, so the client starts the round from it (``swarm.client._runner``); unnamed, a
    SmolLM2 run's rounds at steps 2, 4, ... waited out ``eval_hold_s`` unclaimed and were skipped."""
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, max_tokens=4, mode="sync",
                          eval_hold_s=300.0)
    core = server.core

    def group(task: str) -> None:
        for reward, ep in enumerate((_claim(server, task), _claim(server, task))):
            _chat(server, ep)
            assert _end(server, ep, "finish", {"reward": float(reward)}).status_code == 200

    def eval_round() -> None:
        episode = _claim(server, "h0", purpose="eval", eval_every=1)
        assert episode["step"] == core.step
        _chat(server, episode)
        assert _end(server, episode, "finish", {"reward": 0.5}).status_code == 200

    eval_round()  # step 0's round; its claim tells the server the cadence: a round after every step
    group("t1")
    wait_for(lambda: core.step == 1)
    group("t2")  # step 2's batch is complete, and step 2 waits for step 1's round
    assert core.batch_ready() and core.step == 1
    with server.client() as http:
        refused = http.post("/api/v1/episodes", json={"task_id": "t3"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["detail"] == {"reason": "sync_drain", "step": 1}
    assert core.step == 1 and _status(server)["episodes"]["claimed"] == 4  # the refused claim left nothing
    eval_round()  # what the client does on that refusal: the held step trains as soon as the round ends
    wait_for(lambda: core.step == 2, 60, what="step 2 after step 1's round")
    assert [int(m["metrics"]["eval/step"]) for m in _metrics(server) if "eval/step" in m["metrics"]] == [0, 1]


def test_async_rounds_fall_on_exact_multiples_and_training_ends_at_max_steps(start_server) -> None:
    """Async mode, where a round used to land a step late (its claim waited for a running step): the
    eval claims carry the cadence, so the step after each multiple waits for that multiple's round;
    ``max_steps`` ends training there, while episodes are still served."""
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, max_tokens=4, mode="async",
                          max_staleness=8, max_steps=6)
    heldout = [{"task_id": f"held-{i}"} for i in range(2)]

    def workflow(ep: EpisodeHandle, task: dict) -> float:
        ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=4)
        return 0.5 if ep.episode.purpose == "eval" else float(hash(ep.episode_id) % 2)

    with SwarmClient(server.url, token=server.token) as client:
        def tasks() -> Iterator[dict]:
            # Tasks until the server has reached max_steps, then two groups more: a client that ran out of
            # tasks before step 6 (it may run ahead in async mode) would never claim that step's round.
            i = after = 0
            while after < 4:
                after += client.status().step >= 6
                yield {"task_id": f"t{i}"}
                i += 1

        summary = client.run(tasks(), workflow, group_size=2, concurrency=4, progress=False, heldout=heldout,
                             eval_every=3)

        def eval_steps() -> list[int]:
            return [int(m.metrics["eval/step"]) for m in client.metrics() if "eval/step" in m.metrics]

        # The last round is published once its final episode is recorded, which may trail run()'s return.
        wait_for(lambda: len(eval_steps()) >= 3, 30, what="the step-6 eval round")
        metrics = client.metrics()
        status = client.status()
    assert summary.finished >= 32 and status.step == 6  # 6 steps of one group each + 4 tasks more, served untrained
    assert max(m.step for m in metrics) == 6
    assert [int(m.metrics["eval/step"]) for m in metrics if "eval/step" in m.metrics] == [0, 3, 6]
    assert server.core.evals.every == 3


def test_max_steps_is_a_checked_config_key_and_eval_every_goes_with_eval_claims() -> None:
    from swarm.config import ServerConfig

    assert ServerConfig().patched({"max_steps": 30}).max_steps == 30
    with pytest.raises(ValueError, match="max_steps"):
        ServerConfig().patched({"max_steps": -1})
    with pytest.raises(ValidationError, match="eval_every goes with purpose=eval"):
        ClaimRequest(task_id="t", eval_every=5)
    assert ClaimRequest(task_id="t", purpose="eval", eval_every=5).eval_every == 5


def test_a_round_that_ends_after_the_last_step_is_reported_at_once_and_kept(start_server, tmp_path: Path) -> None:
    """The run stops at its last step and its final round ends after it: the round's eval/* join that
    step's row in /api/v1/metrics and the buffer at once, reach the MLflow run and the researcher's
    metrics.jsonl although the row went out to both before, and a restarted server still reports them."""
    from mlflow.tracking import MlflowClient

    from researcher.evidence.analysis import read_axes
    from researcher.runs.launcher import Launcher
    from researcher.runs.record import METRICS_FILE, RunRecord
    from researcher.session.nodes import monitor

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    server = start_server(group_size=2, min_group_size=2, batch_groups=1, checkpoint_every=1, mlflow_uri=uri)
    a, b = _claim(server, "t1"), _claim(server, "t1")
    for ep, reward in ((a, 0.0), (b, 1.0)):
        _chat(server, ep)
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    wait_for(lambda: server.core.step == 1)  # the last training step
    cursor = server.state_dir / "mlflow.json"  # the step's row went out to MLflow before the round
    wait_for(lambda: cursor.is_file() and json.loads(cursor.read_text())["delivered_step"] == 1, timeout=120)
    # The researcher's monitor polls the run (a real Launcher on the server as an external one).
    run_dir, record = tmp_path / "run", RunRecord(
        key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=0, config={}, client="client.py",
        target_step=1, episodes=2, group_size=2, status="running", external=True, url=server.url)
    run_dir.mkdir()
    ctx = SimpleNamespace(launcher=Launcher(["swarm"], external_token=server.token), say=lambda *_, **__: None)
    state = {"framing": {"metric": "train/reward_mean"}, "options": {}}

    def poll() -> list[str]:
        seen = monitor.Poll(ctx, state, run_dir, record, time.time(), server_alive=True)  # type: ignore[arg-type]
        monitor._fetch(seen)
        return (run_dir / METRICS_FILE).read_text().splitlines()

    assert len(poll()) == 1 and record.logged_step == 1  # step 1's row, before its round

    evals = [_claim(server, f"held-{i}", purpose="eval") for i in range(2)]
    assert [ep["step"] for ep in evals] == [1, 1]
    for ep, reward in zip(evals, (0.25, 0.75), strict=True):
        _chat(server, ep)
        assert _end(server, ep, "finish", {"reward": reward}).status_code == 200
    expected = {"eval/reward_mean": 0.5, "eval/reward_std": 0.25, "eval/episodes": 2.0, "eval/step": 1.0,
                "eval/episodes_total": 2.0}  # the evaluated step's train/episodes_total
    [row] = _metrics(server)  # at once: the finish that ended the round has answered
    assert row["step"] == 1 and row["metrics"]["train/reward_mean"] == 0.5
    assert {k: v for k, v in row["metrics"].items() if k.startswith("eval/")} == expected
    with SwarmClient(server.url, token=server.token) as client:  # what `swarm metrics` shows
        assert client.metrics()[0].metrics == row["metrics"]
    assert [json.loads(body)["metrics"] for body in server.core.store.step_metrics(-1)] == [row["metrics"]]
    lines = poll()  # the monitor re-reads the logged step's row: its eval/* as a line of their own, once
    assert len(lines) == 2 and json.loads(lines[1])["metrics"] == expected and len(poll()) == 2
    curve = read_axes(run_dir, "eval/reward_mean")
    assert curve.steps == [1] and curve.values == [0.5]

    run_id = json.loads(cursor.read_text())["run_id"]
    mlflow = MlflowClient(tracking_uri=uri)
    wait_for(lambda: mlflow.get_metric_history(run_id, "eval/reward_mean"), 60,
             what="the late eval row to reach MLflow", interval=0.2)
    for key, value in expected.items():
        assert [(m.step, m.value) for m in mlflow.get_metric_history(run_id, key)] == [(1, value)]
    assert [m.step for m in mlflow.get_metric_history(run_id, "train/reward_mean")] == [1]  # sent twice, kept once

    server.stop()
    restarted = start_server(state_dir=server.state_dir, group_size=2, min_group_size=2, batch_groups=1)
    assert restarted.core.step == 1 and _metrics(restarted) == [row]


def test_eval_book_ends_rounds_and_pools_a_step_s_later_rounds() -> None:
    book = EvalBook()
    for step in (0, 0):
        book.claimed(step)
    assert book.ended(0, 1.0) is None and book.live == 1  # round 0 still has a live episode
    ended = book.ended(0, None)  # an aborted episode leaves no reward
    assert ended is not None and ended.rewards == [1.0] and book.live == 0
    assert ended.metrics() == {"eval/reward_mean": 1.0, "eval/reward_std": 0.0, "eval/episodes": 1.0,
                               "eval/step": 0.0}
    book.claimed(0)  # a later round of the same policy pools with the first
    pooled = book.ended(0, 0.0)
    assert pooled is not None and pooled.rewards == [1.0, 0.0] and pooled.metrics()["eval/reward_mean"] == 0.5
    book.claimed(5)  # a newer step's round starts afresh; round 0 is forgotten
    assert book.ended(5, 0.25).rewards == [0.25]  # type: ignore[union-attr]
    with pytest.raises(KeyError):
        book.ended(0, 1.0)
    book.claimed(7)
    assert book.ended(7, None).rewards == []  # type: ignore[union-attr]  # every episode failed: nothing to report


def test_a_held_out_task_draws_the_same_noise_under_one_seed_and_fresh_noise_under_another(start_server) -> None:
    """Arms of one seed evaluate a held-out task with the same sampling noise (their difference holds none of
    it); another seed draws afresh, so a study's seeds replicate the held-out noise instead of every run
    reading one frozen draw (whose luck no interval over seeds could see)."""
    replies = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        server = start_server(seed=seed, group_size=2, min_group_size=2, batch_groups=1, max_tokens=24)
        replies[name] = [_chat(server, _claim(server, task, purpose="eval"))["choices"][0]["token_ids"]
                         for task in ("h0", "h1")]
    assert replies["a"] == replies["b"] and replies["c"] != replies["a"]


def test_eval_seed_is_fixed_per_task_and_call_and_fits_int64_with_n() -> None:
    assert eval_seed("held-0", 0) == eval_seed("held-0", 0)
    assert len({eval_seed("held-0", 0), eval_seed("held-0", 1), eval_seed("held-1", 0)}) == 3
    # Another server seed, another draw: a study's seeds replicate the held-out noise, not one frozen draw.
    assert eval_seed("held-0", 0, server_seed=1) != eval_seed("held-0", 0) == eval_seed("held-0", 0, server_seed=0)
    assert all(0 <= eval_seed(f"t{i}", i) <= 2**62 for i in range(100))
    with pytest.raises(ValidationError, match="never grouped"):
        ClaimRequest(task_id="h", purpose="eval", group_size=4)
    with pytest.raises(ValidationError):
        ClaimRequest(task_id="h", purpose="test")


def test_a_client_started_mid_run_evaluates_at_the_next_multiple_only() -> None:
    """A topped-up client whose first claim sees step 24 (every 5) evaluates at 25, never at 24; a
    multiple it missed is skipped, not evaluated late."""
    from swarm.client._run_state import RunState

    state = RunState(iter([]), None, [{"task_id": "h"}], eval_every=5)
    assert not state.eval_due(24) and state.next_eval == 25
    assert state.eval_due(25)
    state.eval_busy = False  # the round ended
    assert not state.eval_due(31) and state.next_eval == 35 and state.eval_due(35)
    fresh = RunState(iter([]), None, [{"task_id": "h"}], eval_every=5)
    assert fresh.eval_due(0)  # a run's first client evaluates the untrained policy
