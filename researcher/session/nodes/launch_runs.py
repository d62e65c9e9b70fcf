"""launch_runs: start the servers of pending trials up to the parallelism, run and time budget.

A run starts only when the launcher can give it the resources it asks for (its GPUs on this
machine, or room on the Ray cluster); otherwise its trial is ``queued`` and retried whenever
launch_runs runs again (after a run ends, or each poll while nothing runs). ``parallel_runs``
(``max_parallel_runs``) is a cap on live runs, not the schedule.

Idempotent: a trial whose run.json records a launch is re-attached to, never started twice (the
crash test counts ``launches``). Each run gets an MLflow child run under the iteration's parent.

The run's client is not started here: its server takes 15-30 s to come up, and launch_runs does not
wait. ``monitor`` starts it on the first poll that finds the server ready
(``monitor._start_client_when_ready``), and restarts or tops it up from then on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from researcher.findings.records import IterationPlan, arm_key
from researcher.runs import record as runs
from researcher.runs import resources
from researcher.runs.processes import LaunchError
from researcher.runs.record import RunRecord
from researcher.runs.status import RunStatus
from researcher.session.context import StudyContext
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, Trial, advance_trial, study_options, sync_trial
from researcher.tracking import review_view

log = logging.getLogger(__name__)
# Episodes per client start: a little over what the step budget consumes, so a run left alone (the
# researcher crashed) goes idle soon after its target instead of training on; a client that runs
# out early (dropped episodes) is restarted by the monitor. Async runs drop stale episodes around
# held-out rounds: with 1.25, clients of 10-30-step runs ran out at steps 8-13 and were restarted.
EPISODE_SLACK = 1.75


def launch(state: StudyState, ctx: StudyContext) -> StudyState:
    options = study_options(state)
    trials: list[Trial] = [t.copy() for t in state["trials"]]
    launched_total = _count_launched(ctx)
    for trial in trials:
        run_dir = Path(trial["run_dir"])
        record = runs.load(run_dir)
        if record is not None and record.status == RunStatus.PARKED:
            _unpark(state, ctx, trials, run_dir, record, trial)
            continue
        if record is not None and (record.launches > 0 or record.ended):
            sync_trial(trial, record)  # re-attach: the monitor keeps polling it (or it is done)
            continue
        if trial["status"] not in (RunStatus.PENDING, RunStatus.QUEUED):
            continue
        active = sum(1 for t in trials if t["status"] == RunStatus.RUNNING)
        if active >= options.parallel_runs:
            break
        if ctx.stop_requested():
            advance_trial(trial, RunStatus.STOPPED)
            _end_queued(ctx, run_dir, record, RunStatus.STOPPED, "stop requested while waiting for resources")
            continue
        if state["budget"]["max_runs"] - launched_total <= 0:
            advance_trial(trial, RunStatus.SKIPPED)
            _end_queued(ctx, run_dir, record, RunStatus.STOPPED, "the study's run budget was spent while it waited")
            continue
        left = budget.time_left(state, ctx.clock())
        if left <= 0 or (state.get("run_seconds") and left < 0.6 * budget.run_estimate_s(state)):
            advance_trial(trial, RunStatus.SKIPPED)
            _end_queued(ctx, run_dir, record, RunStatus.CUT, "too little time left while it waited for resources")
            studyfiles.log(ctx.layout, f"Skipped run {trial['key']}: {left:.0f} s left, a run takes about "
                                       f"{budget.run_estimate_s(state):.0f} s.")
            continue
        record = _new_record(state, ctx, trial, record)
        unmet = ctx.launcher.never_fits(resources.Request(amounts=record.resources))
        if unmet:
            _fail(ctx, run_dir, record, trial, unmet)
            continue
        if not ctx.launcher.reserve(run_dir, record):
            advance_trial(trial, RunStatus.QUEUED)  # retried on the next pass; the monitor wakes it
            continue
        try:
            record = ctx.launcher.start_server(run_dir, record, _config_path(ctx, trial))
        except (LaunchError, OSError) as exc:
            _fail(ctx, run_dir, record, trial, str(exc))
            continue
        launched_total += 1
        sync_trial(trial, record)  # running: a trial's status is its record's once it has one
        ctx.say("launched", key=trial["key"], experiment=trial["experiment"], seed=trial["seed"], url=record.url,
                placement=record.placement, node=record.node, devices=",".join(record.devices) or "-")
    # Servers take a while to load; the monitor starts each client once its server answers, so
    # runs already training keep being watched (and stopped on target) meanwhile.
    return {"trials": trials, "runs_launched": launched_total, "phase": "running"}


def _unpark(state: StudyState, ctx: StudyContext, trials: list[Trial], run_dir: Path, record: RunRecord,
            trial: Trial) -> None:
    """A run parked by an earlier session: resume it from its checkpoint when a slot is free, or end it
    (stop requested, deadline passed); the trial's status follows."""
    if ctx.stop_requested():
        ctx.launcher.end_parked(run_dir, record, RunStatus.STOPPED, "stop requested while parked")
    elif budget.time_left(state, ctx.clock()) <= 0:
        ctx.launcher.end_parked(run_dir, record, RunStatus.CUT,
                                f"deadline reached while parked at step {record.last_step}")
    elif sum(1 for t in trials if t["status"] == RunStatus.RUNNING) >= study_options(state).parallel_runs:
        sync_trial(trial, record)  # parked
        return
    elif not ctx.launcher.reserve(run_dir, record):
        sync_trial(trial, record)
        advance_trial(trial, RunStatus.QUEUED)  # its record stays parked: the next pass tries again
        return
    else:
        try:
            ctx.launcher.unpark(run_dir, record, _config_path(ctx, trial))
        except OSError as exc:
            _fail(ctx, run_dir, record, trial, str(exc))
            return
        studyfiles.log(ctx.layout, f"Run {record.key} resumed from its checkpoint at step {record.last_step} "
                                   f"(resume {record.resumes}).")
        ctx.say("unparked", key=record.key, step=record.last_step)
        sync_trial(trial, record)
        return
    ctx.tracker.end(record.mlflow_run_id, "KILLED" if record.status == RunStatus.STOPPED else "FINISHED")
    studyfiles.log(ctx.layout, f"Run {record.key} ended {record.status}: {record.reason}.")
    sync_trial(trial, record)


def _arm_letter(state: StudyState, trial: Trial) -> str:
    """The arm's letter in this iteration's plan (A, B, ...): the run name starts with it, so MLflow's
    runs list, which cuts long names at the end, still tells the arms apart (the ``arm`` tag says which)."""
    arms = list(dict.fromkeys(t["experiment"] for t in state.get("trials") or [trial]))
    index = arms.index(trial["experiment"]) if trial["experiment"] in arms else len(arms)
    return chr(ord("A") + index) if index < 26 else f"A{index}"


def _arm_tag(iteration: IterationPlan, experiment: str) -> str:
    """The run's arm in MLflow, named by its configuration as the verdict pools arms (same settings = same
    arm, whatever iteration ran it); the n-th of several same-settings arms of one iteration (an A/A check)
    pools with the n-th of another. An experiment missing from the plan is named by itself."""
    planned = iteration.experiment(experiment)
    if planned is None:
        return experiment
    same = arm_key(planned.settings)
    twins = [e.name for e in iteration.experiments if arm_key(e.settings) == same]
    return review_view.arm_label(planned.settings, twins.index(experiment))


def _count_launched(ctx: StudyContext) -> int:
    return sum(1 for r in runs.all_records(ctx.layout.runs_dir) if r.launches > 0)


def _config_path(ctx: StudyContext, trial: Trial) -> Path:
    return ctx.layout.experiment_dir(trial["experiment"]) / "config.toml"


def _new_record(state: StudyState, ctx: StudyContext, trial: Trial, existing: RunRecord | None) -> RunRecord:
    if existing is not None:
        return existing  # written before a crash but never launched: reuse its MLflow run
    import tomllib

    folder = ctx.layout.experiment_dir(trial["experiment"])
    config = tomllib.loads((folder / "config.toml").read_text())
    group_size = int(config.get("group_size", 8))
    iteration = studyfiles.read_plan(ctx.layout).iteration(state["iteration"])
    planned = iteration.experiment(trial["experiment"])
    # The arm's own step target where arms are matched on episodes consumed (``planner.arm_budgets``).
    steps = planned.steps if planned and planned.steps else study_options(state).steps_per_run
    eval_every = planned.eval_every if planned else None
    batch = int(config.get("batch_groups", 4)) * group_size
    episodes = int(steps * batch * EPISODE_SLACK) + batch
    external = bool(ctx.settings.servers)
    url = _free_server(ctx) if external else ""
    child = ctx.tracker.start_child(state["study_id"], state.get("mlflow_parent_run"),
                                    f"{_arm_letter(state, trial)} {trial['experiment']} s{trial['seed']}",
                                    {**config, "seed": trial["seed"], "steps": steps, "run_key": trial["key"]},
                                    {"researcher.run_key": trial["key"], "researcher.experiment": trial["experiment"],
                                     review_view.ARM_TAG: _arm_tag(iteration, trial["experiment"]),
                                     "researcher.iteration": str(state["iteration"]),
                                     "researcher.hypothesis_id": _hypothesis_of(ctx, state["iteration"],
                                                                                trial["experiment"])},
                                    description=f"Training run: arm {trial['experiment']}, seed {trial['seed']}, "
                                                f"{steps} steps (iteration {state['iteration']}, run {trial['key']}).")
    record = RunRecord(key=trial["key"], study_id=state["study_id"], iteration=state["iteration"], trial=trial["trial"],
                       experiment=trial["experiment"], seed=trial["seed"], config=config,
                       client=str(folder / "client.py"), target_step=steps, episodes=episodes, group_size=group_size,
                       eval_every=eval_every, eval_samples=study_options(state).eval_samples,
                       concurrency=batch, threads=ctx.launcher.threads,
                       external=external, url=url, mlflow_run_id=child,
                       resources={} if external else resources.request_for(study_options(state).model_dump(), config,
                                                                           len(ctx.launcher.gpus)).amounts)
    return ctx.launcher.register(Path(trial["run_dir"]), record)


def _hypothesis_of(ctx: StudyContext, iteration: int, experiment: str) -> str:
    planned = studyfiles.read_plan(ctx.layout).iteration(iteration).experiment(experiment)
    return planned.hypothesis if planned else ""


def _free_server(ctx: StudyContext) -> str:
    """An existing server no live run of this study is using (one run per server at a time)."""
    busy = {r.url for r in runs.all_records(ctx.layout.runs_dir) if r.external and not r.ended}
    free = [url for url in ctx.settings.servers if url not in busy]
    return (free or ctx.settings.servers)[0]


def _end_queued(ctx: StudyContext, run_dir: Path, record: RunRecord | None, status: RunStatus, reason: str) -> None:
    """A run that waited for resources and will not start now ends (its MLflow run with it)."""
    if record is None or record.ended or record.launches or record.queued_at is None:
        return
    ctx.launcher.end_parked(run_dir, record, status, reason)
    ctx.tracker.end(record.mlflow_run_id, "KILLED")


def _fail(ctx: StudyContext, run_dir: Path, record: RunRecord, trial: Trial, error: str) -> None:
    ctx.launcher.fail_start(run_dir, record, error)
    ctx.tracker.end(record.mlflow_run_id, "FAILED")
    sync_trial(trial, record)
    studyfiles.log(ctx.layout, f"Run {trial['key']} failed to start: {error.strip().splitlines()[-1][:300]}")
    log.warning("run %s failed to start: %s", trial["key"], error)
