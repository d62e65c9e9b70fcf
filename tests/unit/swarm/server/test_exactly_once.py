"""Store + checkpoints together: the restart protocol trains every acknowledged episode exactly once.

A real subprocess plays a minimal engine whose "weights" are the list of episode ids it trained on
(so the checkpoint itself shows what the model has seen). It is SIGKILLed at arbitrary moments,
restarted on the same state dir each time, and finally runs to completion. The protocol under test
is the one the integration note prescribes: save_finished before acknowledging; train, then
mark_trained, then (sometimes) checkpoint; on start, restore the latest checkpoint, rollback_after
its step and rebuild pending work from untrained().

A run to be killed goes at most ``LOOKAHEAD`` episodes past the kill point and then waits for its
SIGKILL, so the kill lands somewhere in those episodes (a save, a training step, a checkpoint)
however fast the engine runs, never after the run has ended."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.store import EpisodeStore

ROOT = Path(__file__).resolve().parents[4]
TOTAL = 90
LOOKAHEAD = 3

_ENGINE = textwrap.dedent("""
    import json, signal, sys
    from pathlib import Path
    from swarm.server.durability.checkpoints import CheckpointManager
    from swarm.server.durability.store import EpisodeStore, FinishedEpisode
    from swarm.server.records.finished import Outcome
    from swarm.server.records.timeline import EpisodeTrace, Timeline

    state, total, hold = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = EpisodeStore(state / "buffer.db")
    checkpoints = CheckpointManager(state / "checkpoints", keep=2)
    latest = checkpoints.latest()
    step = latest.step if latest else 0
    weights = json.loads((latest.weights_dir / "model.json").read_text()) if latest else []
    store.rollback_after(step)                       # updates after the checkpoint died with us
    pending = [e.episode_id for e in store.untrained()]
    i = store.counts()["finished"]
    first = i

    def train(batch):
        global step
        step += 1
        weights.extend(batch)                         # the "update"
        store.mark_trained(batch, step)               # before any checkpoint of this step
        if step % 2 == 0:
            checkpoints.save(step, step, lambda d: (d / "model.json").write_text(json.dumps(weights)),
                             {"cursor": store.cursor()})

    while i < total:
        if hold and i - first == hold:
            signal.pause()                            # the test's SIGKILL comes before this run ends
        tl = Timeline(tokens=[1, 2, i], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[step], calls=1)
        store.save_finished(FinishedEpisode(episode_id=f"e{i}", task_id="t", group_id=f"g{i // 3}", group_size=3,
                                            category=None, client_id="c", outcome=Outcome(reward=1.0),
                                            trace=EpisodeTrace(timelines=[tl], calls=1)))
        print(f"e{i}", flush=True)                     # = the HTTP finish returning
        pending.append(f"e{i}")
        i += 1
        while len(pending) >= 3:
            batch, pending = pending[:3], pending[3:]
            train(batch)
    if pending:
        train(pending)
    checkpoints.save(step, step, lambda d: (d / "model.json").write_text(json.dumps(weights)),
                     {"cursor": store.cursor()})
    print("done", flush=True)
""")


def _run(state: Path, kill_after: int | None) -> tuple[list[str], int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hold = 0 if kill_after is None else kill_after + LOOKAHEAD
    proc = subprocess.Popen([sys.executable, "-c", _ENGINE, str(state), str(TOTAL), str(hold)],
                            stdout=subprocess.PIPE, text=True, env=env)
    acks: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acks.append(line.strip())
            if kill_after is not None and len(acks) >= kill_after:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=30)
        acks += [line.strip() for line in proc.stdout if line.strip()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return acks, proc.returncode


@pytest.mark.slow
def test_every_acknowledged_episode_is_trained_exactly_once_across_sigkills(tmp_path: Path) -> None:
    acknowledged: list[str] = []
    for kill_after in (7, 16, 5):
        acks, code = _run(tmp_path, kill_after)
        assert code == -signal.SIGKILL, "the run should still have been going when killed"
        acknowledged += acks
    acks, code = _run(tmp_path, None)
    assert code == 0 and acks[-1] == "done"
    acknowledged += acks[:-1]

    assert len(acknowledged) == len(set(acknowledged)) and set(acknowledged) <= {f"e{i}" for i in range(TOTAL)}
    latest = CheckpointManager(tmp_path / "checkpoints").latest()
    assert latest is not None
    weights = collections.Counter(json.loads((latest.weights_dir / "model.json").read_text()))
    assert weights == collections.Counter({f"e{i}": 1 for i in range(TOTAL)})  # the model saw each once
    with EpisodeStore(tmp_path / "buffer.db") as store:
        assert store.trained_counts() == dict(weights)  # and the audit agrees with the model
        assert store.untrained() == []
        assert store.counts()["finished"] == TOTAL
        assert latest.server_state["cursor"] == store.cursor()
