"""`swarm plan` end to end: a slow client leaves the learner idle; the advised concurrency keeps it busy.

A real server trains on a client whose every episode waits PAUSE_S (an agent's tool call, say) with one
episode in flight: the learner is busy a small fraction of the time. `swarm plan` reads the live
figures and advises a concurrency; the same client restarted with it keeps the learner ≥ 0.9 busy.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from support import ROOT, SWARM, ServeProcess, study_run, wait_for

from swarm.client import SwarmClient

PAUSE_S = 0.25
CONFIG = """
group_size = 4
batch_groups = 2
max_tokens = 16
temperature = 1.0
mode = "async"
max_staleness = 4
ppo_epochs = 2
"""
CLIENT = f'''
import random
import string
import time

from swarm.client import run_study_cli

GROUP_SIZE = 4


def tasks(seed):
    rng = random.Random(seed)
    index = 0
    while True:
        yield {{"task_id": f"slow-{{seed}}-{{index}}", "prompt": "".join(rng.choice(string.ascii_lowercase) for _ in range(8))}}
        index += 1


def workflow(ep, task):
    time.sleep({PAUSE_S})  # the agent's own work: a tool call, a sandbox, a judge
    reply = ep.openai().chat.completions.create(model="policy", messages=[{{"role": "user", "content": task["prompt"]}}],
                                                max_tokens=16, temperature=1.0)
    return (reply.choices[0].message.content or "").count("a") / 16


if __name__ == "__main__":
    run_study_cli(__file__)
'''


def _busy(client: SwarmClient, first_step: int) -> list[float]:
    return [s.metrics["perf/learner_busy"] for s in client.metrics(since_step=first_step)]


def test_plan_advice_raises_learner_busy_to_target(new_server: Callable[..., ServeProcess], tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    client_py = tmp_path / "slow_client.py"
    client_py.write_text(CLIENT)
    server = new_server(config=config)
    with SwarmClient(server.url, token=server.token, retry_for_s=10) as client:
        slow_log = tmp_path / "slow.log"
        with study_run(client_py, server, slow_log, ("--concurrency", "1", "--group-size", "4")) as slow:
            wait_for(lambda: client.status().step >= 4, 180, what="step 4", proc=slow, log=slow_log, interval=0.3)
            planned = subprocess.run([*SWARM, "plan", server.url, "--state-dir", str(server.state_dir), "--json"],
                                     cwd=ROOT, capture_output=True, text=True, timeout=60)
        idle = _busy(client, 2)
        assert max(idle) < 0.5, idle
        assert planned.returncode == 0, planned.stderr
        advice = json.loads(planned.stdout)
        assert not advice["enough"] and advice["figures"]["learner_busy"] < 0.5
        concurrency = advice["concurrency_needed"]
        assert concurrency > 1, advice
        # The max_staleness the advised episodes in flight need (one client: its concurrency), by the rule in
        # swarm.plan.staleness_needed. Not a fixed bound: on a loaded machine episodes take longer, so more are
        # in flight a step (a full run under load once went past this server's 4; the advice then says to raise it).
        per_step = advice["figures"]["episodes_per_step"]
        assert advice["staleness_needed"] == max(math.ceil(concurrency / per_step) - 1, 0), advice

        start = client.status().step
        fast_log = tmp_path / "fast.log"
        with study_run(client_py, server, fast_log, ("--concurrency", str(concurrency), "--group-size", "4")) as fast:
            wait_for(lambda: client.status().step >= start + 14, 240, what=f"step {start + 14}", proc=fast,
                     log=fast_log, interval=0.3)
        busy = _busy(client, start + 5)[:9]  # past the ramp-up, while the advised client ran
        # The median of nine: steps slowed by the other test worker's bursts (two of five once, 0.41 and
        # 0.60, in a parallel CI run) are the shared machine, not the advice.
        typical = statistics.median(busy)
        print(f"learner busy {sum(idle) / len(idle):.2f} at concurrency 1 -> {typical:.2f} (median of {busy}) at the "
              f"advised {concurrency}")
        assert typical >= 0.9, (concurrency, busy)
