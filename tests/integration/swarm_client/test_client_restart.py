"""A running client rides out a server crash: SIGKILL the server mid-run, restart it on the same
port and state dir (it keeps its token), and the run keeps claiming and finishing episodes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ServeProcess

from swarm.client import EpisodeHandle, RunSummary, SwarmClient
from swarm.protocol import EpisodeCounts


@pytest.mark.slow
def test_run_survives_server_sigkill_and_restart(new_server: Callable[..., ServeProcess], tmp_path: Path) -> None:
    server = new_server(state_dir=tmp_path / "state")
    finished_before_crash = threading.Event()
    done_count = 0
    lock = threading.Lock()

    def workflow(ep: EpisodeHandle, task: dict) -> float:
        nonlocal done_count
        ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": "abc"}],
                                            max_tokens=2)
        with lock:
            done_count += 1
            if done_count >= 4:
                finished_before_crash.set()
        time.sleep(0.05)
        return 1.0

    tasks = ({"task_id": f"r-{i}"} for i in range(1000))
    result: list[RunSummary | BaseException] = []
    # The token comes from the state dir's token file, which the restarted server reads back.
    client = SwarmClient(server.url, token_file=server.state_dir / "token", retry_for_s=120)

    def run() -> None:
        try:
            result.append(client.run(tasks, workflow, group_size=2, concurrency=2, episodes=40, progress=False))
        except BaseException as exc:  # surfaced by the assertions below
            result.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert finished_before_crash.wait(120), (result, server.log()[-2000:])
        server.kill()
        old_token = server.token
        crashed_at = time.monotonic()
        server.start()  # same port, same state dir
        assert server.token == old_token  # same state dir, same token
        runner.join(timeout=120)
        assert not runner.is_alive(), f"the run did not finish after the restart: {result}"
    finally:
        client.close()
    summary = result[0]
    assert isinstance(summary, RunSummary), f"the run failed: {summary!r}\n{server.log()[-2000:]}"
    # Episodes in flight at the crash are lost (aborted); the run itself kept going to the end.
    assert summary.finished + summary.aborted == 40, summary
    assert summary.aborted <= 4, summary
    with SwarmClient(server.url, token=server.token) as fresh:
        counts: EpisodeCounts = fresh.status().episodes
    assert counts.finished >= 1, "no episode finished on the restarted server"
    assert time.monotonic() - crashed_at < 120
