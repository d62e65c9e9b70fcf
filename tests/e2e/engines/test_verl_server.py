"""``swarm serve --trainer verl`` as a real process: a SIGKILL mid-run, then a restart on the same state dir.

The crash test drives one server (torch generator, verl trainer on Ray with two FSDP2 workers) through
a checkpointed step, an uncheckpointed step and pending finished episodes, SIGKILLs it, and checks:
every Ray process that server started (GCS, raylet, agents, monitors, the training workers, the
watchdog) is gone within 20 s; a restarted server resumes from the checkpoint with a higher policy
version and trains on; and in the end every finished episode of a complete group was trained exactly
once in the live lineage (the rolled-back step's episodes once more, flagged in the audit), while the
finished half of a group whose other member died with the server is dropped on the record
(``swarm.server.durability.recovery`` judges a group on what finished), never silently lost. Each server start
takes ~15-60 s here (Ray and two workers), so the test costs two starts.

A config naming a knob verl cannot honour fails at start, naming it, before Ray is started.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest
from support import ServeProcess, free_port, wait_for

from swarm.client import SwarmClient, SwarmHTTPError
from swarm.server.durability.store import EpisodeStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VERL = ("--trainer", "verl", "--workers", "2")
# Groups of two; one complete group fires a step; a checkpoint every second step. max_staleness: a
# restart gives the restored weights a fresh version id and the restored episodes must still train.
CONFIG = """
group_size = 2
min_group_size = 2
batch_groups = 1
max_staleness = 64
checkpoint_every = 2
max_tokens = 4
"""
START_S = 240.0  # Ray + two workers start in 15-60 s on a quiet machine; more when others share it


def _client(server: ServeProcess) -> SwarmClient:
    return SwarmClient(server.url, token=server.token, retry_for_s=60)


def _finished(client: SwarmClient, group: str, rewards: tuple[float, ...]) -> list[str]:
    """Claim one episode per reward into ``group``, chat once on its key, finish it; its ids."""
    ids = []
    for reward in rewards:
        episode = client.claim(group, group_id=group)
        llm = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0)
        llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "say a"}])
        episode.finish(reward=reward)
        ids.append(episode.episode_id)
    return ids


def _ray_processes(server_pid: int) -> tuple[list[psutil.Process], str]:
    """Every process ``server_pid`` started (its Ray cluster and watchdog) and its Ray session name
    (``session_<date>_<time>_<driver pid>``), which each Ray daemon's command line names."""
    children = psutil.Process(server_pid).children(recursive=True)
    pattern = re.compile(rf"session_[0-9_-]+_{server_pid}\b")
    sessions = {m.group(0) for p in children for m in [pattern.search(" ".join(_cmdline(p)))] if m}
    assert len(sessions) == 1, f"not one Ray session under pid {server_pid}: {sessions}"
    return children, sessions.pop()


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _alive(proc: psutil.Process) -> bool:
    """Still running (the same process: ``is_running`` compares start times) and not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _survivors(started: list[psutil.Process], session: str) -> list[psutil.Process]:
    """Processes of the killed server still alive: the ones seen under it, and any naming its session."""
    left = {p.pid: p for p in started if _alive(p)}
    for proc in psutil.process_iter():
        if proc.pid not in left and any(session in part for part in _cmdline(proc)) and _alive(proc):
            left[proc.pid] = proc
    return list(left.values())


def _describe(procs: list[psutil.Process]) -> list[str]:
    return [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in procs]


def test_sigkill_leaves_no_ray_process_and_a_restart_loses_and_repeats_no_episode(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(CONFIG)
    state = tmp_path / "state"
    first = ServeProcess(port=free_port(), state_dir=state, config=tmp_path / "config.toml", extra_args=VERL)
    second = ServeProcess(port=free_port(), state_dir=state, config=tmp_path / "config.toml", extra_args=VERL)
    started: list[psutil.Process] = []
    try:
        begin = time.monotonic()
        first.start(START_S)
        first_start_s = time.monotonic() - begin
        with _client(first) as client:
            finished = _finished(client, "g1", (0.0, 1.0)) + _finished(client, "g2", (1.0, 0.0))
            wait_for(lambda: client.status().step >= 2, 120, what="two steps")
            wait_for(lambda: (state / "checkpoints" / "step-2").is_dir(), 60, what="the step-2 checkpoint")
            rolled_back = _finished(client, "g3", (0.0, 1.0))  # step 3: after the checkpoint, lost in the crash
            wait_for(lambda: client.status().step >= 3, 120, what="step 3")
            client.patch_config(batch_groups=2)  # from now on one complete group waits for a second
            pending = _finished(client, "g4", (1.0, 0.0))
            half = _finished(client, "g5", (0.5,))  # its partner never finishes: claimed, then lost in the crash
            finished += rolled_back + pending
            status = client.status()
        assert (status.step, status.episodes.finished) == (3, 9), status
        version_before = status.policy_version
        assert version_before >= 3

        started, session = _ray_processes(first.process.pid)
        names = [p.name() for p in started]
        workers = [p for p in started if _cmdline(p)[:1] and _cmdline(p)[0].startswith("ray::SwarmTrainingWorker")]
        assert {"raylet", "gcs_server"} <= set(names) and len(workers) == 2, names
        killed = time.monotonic()
        first.process.send_signal(signal.SIGKILL)  # a crash: no shutdown hook runs
        first.process.wait(timeout=10)
        wait_for(lambda: not _survivors(started, session), 20, interval=0.5,
                 what=lambda: f"the killed server's processes to end (still running: "
                              f"{_describe(_survivors(started, session))})")
        gone_s = time.monotonic() - killed

        begin = time.monotonic()
        second.start(START_S)
        second_start_s = time.monotonic() - begin
        with _client(second) as client:
            status = client.status()  # the restored groups may already be training: no exact step here
            # A group is judged on what finished: half of g5 cannot train and is dropped, on the record.
            assert status.episodes.dropped == 1, status
            assert status.policy_version > version_before  # older weights under a new, higher version id
            versions = [status.policy_version]
            with pytest.raises(SwarmHTTPError, match="no-such-loss"):  # a live patch is checked as a start is
                client.patch_config(policy_loss="no-such-loss")
            assert client.config().values["policy_loss"] == "vanilla"
            # The restored g3 and g4 make a batch of two groups (batch_groups was patched to 2 and
            # the live config survives): training resumes without new work.
            wait_for(lambda: client.status().step >= 3, 120, what="the restored groups train")
            versions.append(client.status().policy_version)
            finished += _finished(client, "g6", (0.0, 1.0)) + _finished(client, "g7", (1.0, 0.0))
            wait_for(lambda: client.status().step >= 4, 120, what="new groups train")
            versions.append(client.status().policy_version)
            assert client.status().groups_pending == 0
            metrics = client.metrics()
        # Resumed from the step-2 checkpoint: the killed step 3 left no metrics, a new step 3 replaced it.
        assert [m.step for m in metrics] == [1, 2, 3, 4], metrics
        assert metrics[1].policy_version <= version_before < metrics[2].policy_version
        assert versions == sorted(versions) and versions[0] < versions[-1], versions  # never backwards
        print(f"verl crash: starts {first_start_s:.0f} s and {second_start_s:.0f} s, {len(started)} processes of "
              f"the killed server gone in {gone_s:.1f} s, versions {version_before} -> {versions}", file=sys.stderr)
        second.stop()
        with EpisodeStore(state / "buffer.db") as store:
            trained = store.trained_counts()
            log = store.training_log()
            counts = store.counts()
        assert len(set(finished)) == 12
        assert trained == dict.fromkeys(finished, 1), trained  # none lost, none trained twice
        assert (counts["finished"], counts["dropped"], counts["untrained"]) == (13, 1, 0), counts
        assert half[0] not in trained
        assert {(3, i, True) for i in rolled_back} <= set(log)  # the lost step stays in the audit, flagged
    finally:
        first.kill()
        second.stop()
        for proc in started:  # a failed run must not leave its Ray cluster to the next tests
            if _alive(proc):
                proc.kill()


def test_an_unsupported_knob_fails_at_start_naming_it(tmp_path: Path) -> None:
    # Every TrainConfig knob is honoured (knobs.HONOURED); "full" KL needs whole distributions,
    # which verl's loss does not get here, so it is the value refused.
    (tmp_path / "config.toml").write_text('kl_coef = 0.1\nkl_penalty = "full"\n')
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=tmp_path / "config.toml",
                          extra_args=VERL)
    begin = time.monotonic()
    returncode = server.run_refused(timeout_s=120)
    elapsed = time.monotonic() - begin
    output = " ".join(server.log().split())  # rich wraps long lines
    assert returncode == 2, output[-2000:]
    assert "kl_penalty 'full' is not supported by the verl trainer" in output, output[-2000:]
    # Refused before Ray: no Ray session was named after the server's pid, none was logged.
    assert not list(Path("/tmp/ray").glob(f"session_*_{server.process.pid}")), output[-2000:]
    assert "Ray started" not in output and "verl trainer:" not in output, output[-2000:]
    assert elapsed < 90, f"took {elapsed:.0f} s to refuse"
