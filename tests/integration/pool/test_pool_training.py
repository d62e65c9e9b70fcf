"""Acceptance: the inference pool trains letters with workers coming and going.

Real processes on loopback: ``swarm serve --no-local-generator`` (every token comes from a pool
worker), three ``swarm worker --engine torch`` processes, and ``swarm run`` of the letters study.
Sync mode (Echo's sequential pull): after each step a worker serves again only once the relay chain
has brought it the new version, so every episode is on-policy and none is dropped as stale (in async
mode rollouts from four processes outrun this machine's learner, and the excess ages out by design).
Mid-run one worker is SIGKILLed while it generates, and later a fourth joins. Training goes on and
the reward rises; the store's audit (the chaos test's) shows every finished episode trained exactly
once or still pending, none aborted, expired or dropped (the killed worker's calls were re-run on
the others: the episodes never saw it); and the late worker took calls only once it held the
current version.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from support import ROOT, ServeProcess, WorkerProcess, free_port, study_run, wait_for

from swarm.server.durability.store import EpisodeStore

LETTERS = ROOT / "studies" / "examples" / "letters"
CONFIG = """lr = 1e-3
group_size = 8
batch_groups = 4
min_group_size = 2
max_tokens = 16
mode = "sync"
worker_lease_s = 6.0
"""
BUDGET_S = 360.0


class _Watch(threading.Thread):
    """Polls the server's status: (time, policy_version, step, workers) while the run goes on."""

    def __init__(self, server: ServeProcess) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.seen: list[tuple[float, int, int, list[dict]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                s = self.server.status()
                self.seen.append((time.time(), s["policy_version"], s["step"], s["workers"]))
            except Exception:  # a poll that fails is skipped
                pass
            self.done.wait(0.1)

    def step(self) -> int:
        return self.seen[-1][2] if self.seen else 0


def _rise(rewards: list[float]) -> float:
    return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pool_of_workers_trains_letters_through_a_crash_and_a_late_join(tmp_path: Path) -> None:
    config = tmp_path / "letters.toml"
    config.write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=config,
                          extra_args=("--no-local-generator",)).start()
    workers = [WorkerProcess(server, f"w{i}", ("--capacity", "32")) for i in range(3)]
    late = WorkerProcess(server, "late", ("--capacity", "32"))
    watch = _Watch(server)
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready()
        watch.start()
        start = time.monotonic()
        rewards: list[float] = []
        pool_rows: list[dict] = []
        rows: list[dict] = []
        with study_run(LETTERS / "client.py", server, tmp_path / "run.log") as run:
            wait_for(lambda: watch.step() >= 3, 120, what="step 3", proc=run)
            victim = workers[0]
            wait_for(lambda: (m := victim.member()) is not None and m["in_flight"] > 0, 30,
                     what="the victim generating", interval=0.01)
            victim.kill()                                              # a worker dies mid-generation
            killed_at_step = watch.step()
            wait_for(lambda: watch.step() >= killed_at_step + 3, 120, what="training after the kill", proc=run)
            late.start()                                               # another joins mid-run
            late.wait_ready()
            while time.monotonic() - start < BUDGET_S and run.poll() is None:
                time.sleep(2.0)
                with server.http() as http:
                    rows = http.get("/api/v1/metrics").json()
                steps = [m["metrics"] for m in rows]
                rewards = [m["train/reward_mean"] for m in steps if "train/reward_mean" in m]
                pool_rows = [m for m in steps if "perf/disseminate_bytes" in m]
                if len(rewards) >= 15 and _rise(rewards) >= 0.3 and watch.step() >= killed_at_step + 8:
                    break
        # The client's last episodes may still train a step after it ends, and a status taken while
        # that version is on its way shows members syncing: the pool's end state is when it settles.
        final = wait_for(lambda: _settled(server.status(), victim, late), 60,
                         what=lambda: f"the victim dropped and the late worker ready ({server.status()['workers']})")
        assert server.stop_via_control() == 0
    finally:
        watch.done.set()
        for worker in [*workers, late]:
            worker.stop()
        server.stop()
    output = (tmp_path / "run.log").read_text(errors="replace")
    print(f"pool letters: {len(rewards)} steps, first5={sum(rewards[:5]) / 5:.3f} last5={sum(rewards[-5:]) / 5:.3f}, "
          f"killed at step {killed_at_step}", file=sys.stderr)
    assert len(rewards) >= 15 and _rise(rewards) >= 0.3, f"rewards {rewards}\n{output[-2000:]}"
    # Every step sent its version to the workers: bytes relayed, most of the pool ready after it.
    assert pool_rows and all(m["perf/disseminate_bytes"] > 0 and m["pool/ready"] >= 2 for m in pool_rows[-5:])
    assert any(m["pool/full_sync"] == 0.0 for m in pool_rows), "every version went out in full: no deltas"
    # Sync mode: a step waits for its own version's push, so it reports that push.
    assert all(r["metrics"]["pool/disseminated_version"] == r["policy_version"] for r in rows
               if "pool/disseminated_version" in r["metrics"])
    states = {w["address"]: w["state"] for w in final["workers"]}
    assert states[victim.url] == "dropped" and states[late.url] == "ready", states
    assert "continue on another" in server.log(), "the victim had calls in flight; they must have been re-run"
    _late_served_only_when_synced(watch, late)
    _every_finished_episode_trained_once_or_pending(server.state_dir)


def _settled(status: dict, victim: WorkerProcess, late: WorkerProcess) -> dict | None:
    states = {w["address"]: w["state"] for w in status["workers"]}
    return status if states.get(victim.url) == "dropped" and states.get(late.url) == "ready" else None


def _late_served_only_when_synced(watch: _Watch, late: WorkerProcess) -> None:
    """Every poll that shows the late worker with calls in flight shows it ready on the current
    version (a poll may see the trainer one version ahead: its step publishes next)."""
    seen = [(v, next((w for w in ws if w["address"] == late.url), None)) for _, v, _, ws in watch.seen]
    serving = [(v, m) for v, m in seen if m is not None and m["in_flight"] > 0]
    assert serving, "the late worker never took a call"
    for version, member in serving:
        assert member["state"] == "ready" and member["version"] is not None, member
        assert version - member["version"] <= 1, (version, member)
    syncing = [m for _, m in seen if m is not None and m["state"] == "syncing"]
    assert all(m["in_flight"] == 0 for m in syncing)


def _every_finished_episode_trained_once_or_pending(state_dir: Path) -> None:
    with EpisodeStore(state_dir / "buffer.db") as store:
        trained = store.trained_counts()
        pending = {e.episode_id for e in store.untrained()}
        counts = store.counts()
    assert all(n == 1 for n in trained.values()), "an episode was trained twice"
    assert not set(trained) & pending
    assert len(trained) + len(pending) == counts["finished"], counts
    assert counts["aborted"] == 0 and counts["expired"] == 0 and counts["dropped"] == 0, counts
