"""The smoke run: a few episodes of a new client against a fresh server (or a given one), before the
client trains (``Launcher.smoke``, called by the validate node for ``researcher.runs.preflight``'s checks).
"""

from __future__ import annotations

from pathlib import Path

from researcher.runs import detached, sandbox
from researcher.runs import record as runs
from researcher.runs.logs import ABORTED, CLIENT_LOG, SUMMARY, last_line
from researcher.runs.processes import STATE_DIR, LaunchError, RunProcesses
from researcher.runs.record import RunRecord
from swarm import ports


def run(launcher: RunProcesses, client_path: Path, config_path: Path, work_dir: Path, *, episodes: int,
        group_size: int, timeout_s: float, server_url: str | None = None,
        rewards_out: Path | None = None) -> str | None:
    """Run ``episodes`` episodes of a client against a fresh server; None if it worked, else the error
    (its first line the verdict, the client's log tail below).

    The client runs boxed like a training run's (``researcher.runs.sandbox``); on timeout its whole
    process group is killed. Episodes are claimed a group at a time (concurrency = ``group_size``);
    with ``rewards_out`` every episode's reward is recorded there (``swarm run --rewards-out``), for
    the checks of ``researcher.runs.preflight``."""
    runs.private_dir(work_dir)
    record = RunRecord(key="smoke", study_id="smoke", iteration=0, trial=0, experiment="smoke", seed=0,
                       config={}, client=str(client_path), target_step=0, episodes=episodes,
                       group_size=group_size, external=server_url is not None, url=server_url or "",
                       state_dir="" if server_url else str(work_dir / STATE_DIR))
    try:
        if server_url is None:
            record.port = ports.free_port()
            record.url = f"http://127.0.0.1:{record.port}"
            record.server_pid, record.server_started = launcher._spawn_server(work_dir, config_path, record)
            runs.save(work_dir, record)  # a researcher killed from here on leaves it: the next session stops it
        try:
            launcher.wait_ready(work_dir, record)
        except LaunchError as exc:
            return str(exc)
        argv = [*launcher.swarm_command, "run", str(client_path), *sandbox.box_flags(launcher.box_read),
                "--server", record.url, "--episodes", str(episodes), "--group-size", str(group_size),
                "--concurrency", str(group_size), "--retry-for", "10"]
        if rewards_out is not None:
            argv += ["--rewards-out", str(rewards_out)]
        env = sandbox.study_env(work_dir, client_token=launcher.client_token(record), threads=launcher.threads)
        done = sandbox.run_boxed(argv, env=env, cwd=work_dir, limits=sandbox.Limits.for_episodes(episodes),
                                 timeout_s=timeout_s)
        (work_dir / CLIENT_LOG).write_text(done.output)
        output = done.output
        if done.timed_out:
            return (f"the smoke run of {episodes} episodes did not finish within {timeout_s:.0f} s "
                    f"(its processes were killed):\n{output[-3000:]}")
        if done.returncode != 0:
            return f"`swarm run` {done.describe()}: {last_line(output)}\n{output[-6000:]}"
        counts = SUMMARY.search(output)
        if counts is None:
            return f"`swarm run` printed no summary line:\n{output[-6000:]}"
        finished, aborted = int(counts.group(1)), int(counts.group(2))
        if aborted or not finished:
            # The runner logs the first aborted episode's traceback: that is what repair needs.
            first = ABORTED.search(output)
            why = f"; the first: {first.group(1).strip()}" if first else ""
            return f"{aborted} of {finished + aborted} smoke episodes aborted{why}\n{output[-6000:]}"
        return None
    finally:
        if server_url is None:
            detached.stop_group(record.server_pid, record.server_started, grace_s=5.0)


def stop_leftovers(smoke_root: Path) -> int:
    """Stop the smoke servers a SIGKILLed session left running (its ``finally`` never ran); each smoke
    run's record names its server. Returns how many were still alive."""
    stopped = 0
    for record in runs.all_records(smoke_root):
        if not record.external and detached.alive(record.server_pid, record.server_started):
            detached.stop_group(record.server_pid, record.server_started, grace_s=5.0)
            stopped += 1
    return stopped
