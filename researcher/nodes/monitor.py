"""monitor: poll running runs, log their metrics to MLflow in batches, and enforce the watchdog.

One call polls until some run ends (so ``launch_runs`` can fill the slot) or all have ended:
- a run reaching its step budget is stopped (control stop) and marked finished;
- a dead server is a crash; a dead client with steps to go is restarted (bounded);
- no new step for ``stall_timeout_s`` is a stall; non-finite metrics are a divergence;
- the deadline (minus the report reserve) cuts every run; a stop request stops them;
- no finished episode for ``client_stuck_s`` while the server waits for episodes: the client is
  hung, so it is restarted (the stuck-client watchdog);
- a session that must park (window over, a watchdog) returns at once: ``park`` checkpoints the runs.
Per-step metrics go to the run's metrics.jsonl and its MLflow child run (``log_batch`` per poll).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from swarm.client import SwarmError

from researcher import budget, procs, runs, studyfiles, watchdogs
from researcher.context import StudyContext
from researcher.launcher import CLIENT_LOG, SERVER_LOG, tail
from researcher.runs import RunRecord
from researcher.state import StudyState, Trial

log = logging.getLogger(__name__)
_MLFLOW_STATUS = {"finished": "FINISHED", "cut": "FINISHED", "stopped": "KILLED"}


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    options = state["options"]
    trials: list[Trial] = [dict(t) for t in state["trials"]]  # type: ignore[misc]
    seconds = list(state.get("run_seconds") or [])
    while True:
        if ctx.should_park():
            break
        ended_now = 0
        for trial in trials:
            if trial["status"] != "running":
                continue
            run_dir = Path(trial["run_dir"])
            record = runs.load(run_dir)
            if record is None:
                trial["status"] = "crashed"
                ended_now += 1
                continue
            if not record.ended:
                record = _poll(ctx, state, run_dir, record)
            if record.ended:
                _close(ctx, run_dir, record)
                trial["status"] = record.status
                if record.status == "finished" and record.wall_s is not None:
                    seconds.append(round(record.wall_s, 1))
                ended_now += 1
        running = [t for t in trials if t["status"] == "running"]
        if ended_now or not running:
            break
        time.sleep(options["poll_interval_s"])
    return {"trials": trials, "run_seconds": seconds, "phase": "running"}


def _poll(ctx: StudyContext, state: StudyState, run_dir: Path, record: RunRecord) -> RunRecord:
    options, now = state["options"], ctx.clock()
    launcher = ctx.launcher
    if record.ending is not None:  # a stop decided before a crash of the researcher: finish it
        return launcher.stop(run_dir, record, record.ending, record.reason)
    if ctx.stop_requested():
        return launcher.stop(run_dir, record, "stopped", "stop requested")
    server_alive = record.external or procs.alive(record.server_pid, record.server_started)
    if record.client_pid is None:
        return _start_client_when_ready(ctx, run_dir, record, server_alive, now)
    try:
        with launcher.client_for(record, timeout=10.0) as client:
            status = client.status()
            # Filter here too: the server treats since_step as exclusive, the client doc as inclusive.
            new = [m for m in client.metrics(since_step=record.logged_step) if m.step > record.logged_step]
    except SwarmError as exc:
        if not server_alive:
            return launcher.stop(run_dir, record, "crashed", f"server exited:\n{tail(run_dir / SERVER_LOG, 15)}")
        log.info("polling %s failed: %s", record.key, exc)
        status, new = None, []
    if new:
        runs.append_metrics(run_dir, new)
        if record.mlflow_run_id:
            ctx.tracker.log_steps(record.mlflow_run_id, new)
        record.logged_step = max(m.step for m in new)
        bad = [k for m in new for k, v in m.metrics.items() if not math.isfinite(v)]
        if bad:
            runs.save(run_dir, record)
            return launcher.stop(run_dir, record, "diverged", f"non-finite metrics: {sorted(set(bad))[:5]}")
    if status is not None:
        step = status.step - record.base_step
        if step > record.last_step:
            record.last_step, record.last_progress_at = step, now
            reward = new[-1].metrics.get(state["framing"]["metric"]) if new else None
            ctx.say("progress", key=record.key, experiment=record.experiment, seed=record.seed, step=step,
                    target=record.target_step - record.base_step, reward=reward)
        if status.step >= record.target_step:
            runs.save(run_dir, record)
            return launcher.stop(run_dir, record, "finished", f"reached step {step}")
    if budget.time_left(state, now) <= 0:
        runs.save(run_dir, record)
        return launcher.stop(run_dir, record, "cut", f"deadline reached at step {record.last_step}")
    if now - record.last_progress_at > options["stall_timeout_s"]:
        runs.save(run_dir, record)
        return launcher.stop(run_dir, record, "stalled",
                             f"no training step for {options['stall_timeout_s']:.0f} s (at step {record.last_step})")
    if not server_alive:
        return launcher.stop(run_dir, record, "crashed", f"server exited:\n{tail(run_dir / SERVER_LOG, 15)}")
    if status is not None:
        finished = status.episodes.finished
        waiting = status.state.value == "running"  # serving, not training or paused: it needs episodes
        if watchdogs.client_stuck(finished_now=finished, finished_before=record.finished_seen,
                                  since=record.finished_seen_at, now=now, server_waiting=waiting,
                                  limit_s=options.get("client_stuck_s", 600.0)) \
                and procs.alive(record.client_pid, record.client_started):
            studyfiles.log(ctx.layout, f"Run {record.key}: no episode finished for "
                                       f"{options.get('client_stuck_s', 600.0):.0f} s while the server waited; "
                                       "the client looks hung, restarting it.")
            procs.stop_group(record.client_pid, record.client_started, grace_s=3.0)
            record.finished_seen_at = now  # the restarted client gets a full period
        if finished > record.finished_seen or not waiting:
            record.finished_seen, record.finished_seen_at = finished, now
    if not procs.alive(record.client_pid, record.client_started):
        if record.client_starts > options["max_client_restarts"]:
            return launcher.stop(run_dir, record, "crashed",
                                 f"client exited {record.client_starts} times:\n{tail(run_dir / CLIENT_LOG, 15)}")
        studyfiles.log(ctx.layout, f"Run {record.key}: the client exited at step {record.last_step}; restarting it "
                                   f"(start {record.client_starts + 1}).")
        ctx.say("client_restart", key=record.key, step=record.last_step)
        record = launcher.start_client(run_dir, record)
    runs.save(run_dir, record)
    return record


def _start_client_when_ready(ctx: StudyContext, run_dir: Path, record: RunRecord, server_alive: bool,
                             now: float) -> RunRecord:
    with ctx.launcher.client_for(record, timeout=2.0) as client:
        healthy = client.health()
    if healthy:
        record.last_progress_at = record.finished_seen_at = now
        return ctx.launcher.start_client(run_dir, record)
    if not server_alive:
        return ctx.launcher.stop(run_dir, record, "crashed",
                                 f"server exited while starting:\n{tail(run_dir / SERVER_LOG, 15)}")
    if now - max(record.started_at, record.resumed_at or 0.0) > ctx.launcher.ready_timeout_s:
        return ctx.launcher.stop(run_dir, record, "crashed",
                                 f"server not ready after {ctx.launcher.ready_timeout_s:.0f} s:\n"
                                 f"{tail(run_dir / SERVER_LOG, 15)}")
    return record


def _close(ctx: StudyContext, run_dir: Path, record: RunRecord) -> None:
    """Attach code, config and logs to the MLflow child run and close it with the matching status."""
    if not record.mlflow_run_id:
        return
    folder = Path(record.client).parent
    ctx.tracker.log_files(record.mlflow_run_id, [folder / "client.py", folder / "config.toml",
                                                 run_dir / "run.json", run_dir / SERVER_LOG, run_dir / CLIENT_LOG],
                          "run")
    ctx.tracker.log_values(record.mlflow_run_id, {"run/last_step": record.last_step,
                                                  "run/client_starts": record.client_starts})
    ctx.tracker.end(record.mlflow_run_id, _MLFLOW_STATUS.get(record.status, "FAILED"))
    studyfiles.log(ctx.layout, f"Run {record.key} ({record.experiment}, seed {record.seed}) ended {record.status}: "
                               f"{record.reason.strip().splitlines()[0] if record.reason.strip() else ''}")
    ctx.say("ended", key=record.key, status=record.status, step=record.last_step)
