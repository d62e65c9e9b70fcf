"""monitor: poll running runs, log their metrics to MLflow in batches, and enforce the watchdog.

One call polls until some run ends (so ``launch_runs`` can fill the slot) or all have ended:
- a run reaching its step budget (its server trains no step past it) is stopped (control stop) and
  marked finished, once the held-out round of that step is logged (if its cadence has one there);
- a dead server is restarted from its last checkpoint (``revive``, bounded), else a crash; a client
  that ran all its episodes is topped up, a failed one restarted (bounded: ``max_client_restarts`` in a
  row, with no training step between them);
- no new step for ``stall_timeout_s`` is a stall; non-finite metrics are a divergence;
- the deadline (minus the report reserve) cuts every run; a stop request stops them;
- no finished episode for ``client_stuck_s`` while the server waits for episodes: the client is
  hung, so it is restarted (the stuck-client watchdog);
- a session that must park (window over, a watchdog) returns at once: ``park`` checkpoints the runs.
Per-step metrics go to the run's metrics.jsonl; the run's server writes them to its MLflow child run
(the monitor copies them there only for a run whose server could not be given the run).

Each of those rules is a named check that returns an ending (status, reason) or None; a poll runs
them in order and the first ending stops the run through the launcher, which saves its record.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from researcher.evidence import analysis
from researcher.runs import record as runs
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus
from researcher.session import watchdogs
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, Trial, advance_trial, framing_metric, study_options, sync_trial
from swarm import tracking
from swarm.client import SwarmError
from swarm.protocol import Status, StepMetrics

log = logging.getLogger(__name__)
_MLFLOW_STATUS = {"finished": "FINISHED", "cut": "FINISHED", "stopped": "KILLED"}


def poll_runs(state: StudyState, ctx: StudyContext) -> StudyState:
    options = study_options(state)
    trials: list[Trial] = [t.copy() for t in state["trials"]]
    seconds = list(state.get("run_seconds") or [])
    while True:
        if ctx.should_park():
            break
        ended_now = 0
        for trial in trials:
            if trial["status"] != RunStatus.RUNNING:
                continue
            run_dir = Path(trial["run_dir"])
            record = runs.load(run_dir)
            if record is None:
                advance_trial(trial, RunStatus.CRASHED)  # its run.json is gone: nothing to own the status
                ended_now += 1
                continue
            if not record.ended:
                record = _poll(ctx, state, run_dir, record)
            if record.ended:
                _close(ctx, run_dir, record)
                sync_trial(trial, record)
                if record.status == RunStatus.FINISHED and record.wall_s is not None:
                    seconds.append(round(record.wall_s, 1))
                ended_now += 1
        running = [t for t in trials if t["status"] == RunStatus.RUNNING]
        if ended_now or not running:
            if not running and not ended_now and any(t["status"] == RunStatus.QUEUED for t in trials):
                time.sleep(options.poll_interval_s)  # all wait for resources held elsewhere: retry soon
            break
        time.sleep(options.poll_interval_s)
    return {"trials": trials, "run_seconds": seconds, "phase": "running"}


Ending = tuple[str, str]  # (status, reason) a run ends with


@dataclass
class Poll:
    """What one poll of a live run saw: the inputs of every check."""

    ctx: StudyContext
    state: StudyState
    run_dir: Path
    record: RunRecord
    now: float
    server_alive: bool
    status: Status | None = None   # None when the server did not answer
    new: list[StepMetrics] = field(default_factory=list)  # metrics newer than the run's logged step
    bad: list[str] = field(default_factory=list)  # names of non-finite metrics among ``new``


def _ending_decided(poll: Poll) -> Ending | None:
    """A stop decided before the researcher crashed: finish the same ending."""
    record = poll.record
    return (record.ending, record.reason) if record.ending is not None else None


def _stop_requested(poll: Poll) -> Ending | None:
    return ("stopped", "stop requested") if poll.ctx.stop_requested() else None


def _unreachable_and_dead(poll: Poll) -> Ending | None:
    """The server did not answer the poll because it is gone."""
    if poll.status is None and not poll.server_alive:
        return "crashed", f"server exited:\n{poll.ctx.launcher.server_log(poll.run_dir)}"
    return None


def _diverged(poll: Poll) -> Ending | None:
    return ("diverged", f"non-finite metrics: {sorted(set(poll.bad))[:5]}") if poll.bad else None


def _reached_target(poll: Poll) -> Ending | None:
    """The server trained its last step (it trains none past it: ``--max-steps``), and the held-out
    round of that step, when the run's cadence has one there, has been logged (or waited for enough)."""
    if poll.status is None or poll.status.step < poll.record.target_step:
        return None
    if _final_round_due(poll) and poll.now - poll.record.last_progress_at < FINAL_ROUND_WAIT_S:
        return None
    return "finished", f"reached step {poll.status.step - poll.record.base_step}"


FINAL_ROUND_WAIT_S = 30.0  # how long a run at its target step waits for that step's held-out round


def _final_round_due(poll: Poll) -> bool:
    """The run evaluates every k steps (its logged rounds say so), k divides the target step, and the
    target's round is not logged yet: stopping now would leave some runs of a study without it."""
    steps, _ = runs.read_curve(poll.run_dir, analysis.EVAL_METRIC)
    gaps = [b - a for a, b in itertools.pairwise(steps) if b > a]
    target = poll.record.target_step
    return bool(gaps) and target % min(gaps) == 0 and target not in steps


def _deadline(poll: Poll) -> Ending | None:
    if budget.time_left(poll.state, poll.now) <= 0:
        return "cut", f"deadline reached at step {poll.record.last_step}"
    return None


def _stalled(poll: Poll) -> Ending | None:
    limit = study_options(poll.state).stall_timeout_s
    if poll.now - poll.record.last_progress_at > limit:
        return "stalled", f"no training step for {limit:.0f} s (at step {poll.record.last_step})"
    return None


def _server_exited(poll: Poll) -> Ending | None:
    return None if poll.server_alive else ("crashed", f"server exited:\n{poll.ctx.launcher.server_log(poll.run_dir)}")


def _client_gave_up(poll: Poll) -> Ending | None:
    """The client failed again after as many restarts in a row as the run allows, with no training step
    between them (a client that used up its episodes is topped up, which is no failure). Counted in a
    row, not in all: a run of days whose client is killed now and then (the OOM killer, a node drained)
    and trains between the kills is not crashed for it."""
    record, launcher = poll.record, poll.ctx.launcher
    if launcher.client_alive(record) or launcher.client_used_up(poll.run_dir, record) \
            or _failures_in_a_row(record) < study_options(poll.state).max_client_restarts:
        return None
    return "crashed", (f"client failed {_failures_in_a_row(record) + 1} times in a row at step {record.last_step}:\n"
                       f"{launcher.client_log(poll.run_dir)}")


def _failures_in_a_row(record: RunRecord) -> int:
    """Client failures since the run last trained (0 when a step came after the latest failure)."""
    return record.client_failures_in_a_row if record.last_step == record.client_failed_at_step else 0


def _count_client_failure(record: RunRecord) -> None:
    """A failed client is about to be restarted: count it in all (the report) and in a row."""
    record.client_restarts += 1
    record.client_failures_in_a_row = _failures_in_a_row(record) + 1
    record.client_failed_at_step = record.last_step


# In order; the first ending found ends the run. Between the groups the poll acts on the run:
# it fetches and logs metrics (then records progress unless they diverged) and restarts a hung client.
BEFORE_POLL = (_ending_decided, _stop_requested)
AFTER_POLL = (_unreachable_and_dead, _diverged, _reached_target, _deadline, _stalled, _server_exited)
AFTER_WATCHDOG = (_client_gave_up,)


def _first_ending(checks: tuple[Callable[[Poll], Ending | None], ...], poll: Poll) -> Ending | None:
    return next((ending for check in checks if (ending := check(poll)) is not None), None)


def _poll(ctx: StudyContext, state: StudyState, run_dir: Path, record: RunRecord) -> RunRecord:
    launcher = ctx.launcher
    poll = Poll(ctx, state, run_dir, record, ctx.clock(), server_alive=True)
    ending = _first_ending(BEFORE_POLL, poll)
    if ending is not None:
        return launcher.stop(run_dir, record, *ending)
    poll.server_alive = launcher.server_alive(record)
    if not poll.server_alive and launcher.revive(run_dir, record):
        studyfiles.log(ctx.layout, f"Run {record.key}: its server went away at step {record.last_step}; "
                                   f"restarted, resuming from its checkpoint (resume {record.resumes}).")
        ctx.say("revived", key=record.key, step=record.last_step)
        return record
    if launcher.awaiting_client(record):
        return _start_client_when_ready(ctx, run_dir, record, poll.server_alive, poll.now)
    _fetch(poll)
    ending = _first_ending(AFTER_POLL, poll)
    if ending is None:
        _restart_hung_client(poll)
        ending = _first_ending(AFTER_WATCHDOG, poll)
    if ending is not None:
        return launcher.stop(run_dir, record, *ending)
    if not launcher.client_alive(record):
        if launcher.client_used_up(run_dir, record):
            studyfiles.log(ctx.layout, f"Run {record.key}: the client ran all its episodes at step {record.last_step}; "
                                       "topping it up with another client.")
        else:
            _count_client_failure(record)
            studyfiles.log(ctx.layout, f"Run {record.key}: the client failed at step {record.last_step}; restarting "
                                       f"it (restart {record.client_restarts}).")
            ctx.say("client_restart", key=record.key, step=record.last_step)
        return launcher.start_client(run_dir, record)
    return launcher.note_progress(run_dir, record)


def _fetch(poll: Poll) -> None:
    """Read the server's status and new metrics, log the metrics, and record progress."""
    ctx, record = poll.ctx, poll.record
    try:
        with ctx.launcher.client_for(record, timeout=10.0) as client:
            poll.status = client.status()
            # From the logged step: its row may have gained a held-out round's eval/* since it was logged.
            rows = client.metrics(since_step=max(record.logged_step - 1, 0))
            # Filter here too: the server treats since_step as exclusive, the client doc as inclusive.
            poll.new = [m for m in rows if m.step > record.logged_step]
            late = _late_eval(poll.run_dir, next((m for m in rows if m.step == record.logged_step), None))
    except SwarmError as exc:
        poll.status, poll.new = None, []
        if poll.server_alive:
            log.info("polling %s failed: %s", record.key, exc)
        return
    if late is not None:
        runs.append_metrics(poll.run_dir, [late])
        if record.mlflow_run_id and not record.server_logs_mlflow:
            ctx.tracker.log_steps(record.mlflow_run_id, [late])
    if poll.new:
        runs.append_metrics(poll.run_dir, poll.new)
        if record.mlflow_run_id and not record.server_logs_mlflow:  # one writer per run's metrics
            ctx.tracker.log_steps(record.mlflow_run_id, poll.new)
        record.logged_step = max(m.step for m in poll.new)
        poll.bad = [k for m in poll.new for k, v in m.metrics.items() if not math.isfinite(v)]
    if poll.bad:
        return  # a diverged run ends on this poll; its progress stays where it was
    # The metrics are read after the status: a step committed between the two reads is in metrics.jsonl
    # already, so it counts (run.json's last_step must cover every step the run's record logged).
    step = max(poll.status.step, record.logged_step) - record.base_step
    if step > record.last_step:
        record.last_step, record.last_progress_at = step, poll.now
        reward = poll.new[-1].metrics.get(framing_metric(poll.state)) if poll.new else None
        ctx.say("progress", key=record.key, experiment=record.experiment, seed=record.seed, step=step,
                target=record.target_step - record.base_step, reward=reward,
                train_reward=poll.new[-1].metrics.get("train/reward_mean") if poll.new else None)


def _late_eval(run_dir: Path, row: StepMetrics | None) -> StepMetrics | None:
    """The ``eval/*`` of the logged step's ``row`` as a row of its own, when the run's last logged line
    lacks them: the server adds a held-out round to the row of the step it evaluated when the round
    ends, which may be after that row was logged (``read_axes`` merges the lines of one step)."""
    evals = {k: v for k, v in row.metrics.items() if k.startswith("eval/")} if row is not None else {}
    if row is None or not evals:
        return None
    last = _last_logged(run_dir)
    if last is not None and last.get("step") == row.step \
            and all(last.get("metrics", {}).get(k) == v for k, v in evals.items()):
        return None
    return row.model_copy(update={"metrics": evals})


def _last_logged(run_dir: Path) -> dict[str, Any] | None:
    """The last line of the run's metrics.jsonl, read from the end (the file grows with the run)."""
    try:
        with open(run_dir / runs.METRICS_FILE, "rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(file.tell() - 65536, 0))
            lines = [line for line in file.read().splitlines() if line.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):  # none yet, or a line cut by a crash: log the evaluation (again)
        return None


def _restart_hung_client(poll: Poll) -> None:
    """The stuck-client watchdog: no episode finished for ``client_stuck_s`` while the server waited
    for episodes, so the client is hung; stop it (the restart follows like any client exit)."""
    ctx, record, status, now = poll.ctx, poll.record, poll.status, poll.now
    if status is None:
        return
    limit = study_options(poll.state).client_stuck_s
    finished = status.episodes.finished
    waiting = status.state.value == "running"  # serving, not training or paused: it needs episodes
    if watchdogs.client_stuck(finished_now=finished, finished_before=record.finished_seen,
                              since=record.finished_seen_at, now=now, server_waiting=waiting, limit_s=limit) \
            and ctx.launcher.client_alive(record):
        studyfiles.log(ctx.layout, f"Run {record.key}: no episode finished for {limit:.0f} s while the server "
                                   "waited; the client looks hung, restarting it.")
        ctx.say("watchdog", name="client_stuck", key=record.key, step=record.last_step, limit_s=limit)
        ctx.launcher.stop_client(record)
        record.finished_seen_at = now  # the restarted client gets a full period
    if finished > record.finished_seen or not waiting:
        record.finished_seen, record.finished_seen_at = finished, now


def _start_client_when_ready(ctx: StudyContext, run_dir: Path, record: RunRecord, server_alive: bool,
                             now: float) -> RunRecord:
    with ctx.launcher.client_for(record, timeout=2.0) as client:
        healthy = client.health()
    if healthy:
        record.last_progress_at = record.finished_seen_at = now
        return ctx.launcher.start_client(run_dir, record)
    if not server_alive:
        return ctx.launcher.stop(run_dir, record, "crashed",
                                 f"server exited while starting:\n{ctx.launcher.server_log(run_dir)}")
    waited = now - max(record.started_at, record.resumed_at or 0.0)
    limit = ctx.launcher.ready_timeout_for(record)
    if record.queued_at is None and waited > limit:  # queued: its wait is not start-up
        return ctx.launcher.stop(run_dir, record, "crashed", f"server not ready after {limit:.0f} s:\n"
                                 f"{ctx.launcher.server_log(run_dir)}")
    return record


def _deliver_left_steps(ctx: StudyContext, run_dir: Path, record: RunRecord) -> None:
    """A server stopped while MLflow was away keeps its undelivered steps in its buffer for a next start
    that never comes once the run has ended: send the ones its cursor lacks from metrics.jsonl (the
    tracker spools them if MLflow is still away; a step sent twice is stored once)."""
    delivered = tracking.delivered_step(Path(record.state_dir) / tracking.SERVER_CURSOR_FILE,
                                        record.mlflow_run_id) if record.state_dir else 0
    left = runs.read_steps(run_dir, after=delivered)
    if left and record.mlflow_run_id:
        log.info("run %s: its server delivered MLflow steps through %d; sending %d more", record.key, delivered,
                 len(left))
        ctx.tracker.log_steps(record.mlflow_run_id, left)


def _close(ctx: StudyContext, run_dir: Path, record: RunRecord) -> None:
    """Attach code, config and logs to the MLflow child run and close it with the matching status."""
    if not record.mlflow_run_id:
        return
    if record.server_logs_mlflow:
        _deliver_left_steps(ctx, run_dir, record)
    folder = Path(record.client).parent
    ctx.tracker.log_files(record.mlflow_run_id,
                          [folder / "client.py", folder / "config.toml", *ctx.launcher.log_files(run_dir)], "run")
    # Tags, not one-point metrics (each would be a chart of its own in MLflow's run view).
    ctx.tracker.set_tags(record.mlflow_run_id, {"researcher.last_step": str(record.last_step),
                                                "researcher.client_starts": str(record.client_starts),
                                                "researcher.client_restarts": str(record.client_restarts)})
    ctx.tracker.end(record.mlflow_run_id, _MLFLOW_STATUS.get(record.status, "FAILED"))
    studyfiles.log(ctx.layout, f"Run {record.key} ({record.experiment}, seed {record.seed}) ended {record.status}: "
                               f"{record.reason.strip().splitlines()[0] if record.reason.strip() else ''}")
    ctx.say("ended", key=record.key, status=record.status, step=record.last_step,
            reason=(record.reason.strip().splitlines() or [""])[0][:200])
