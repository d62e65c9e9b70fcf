"""park: end this session cleanly (its window is over, or a watchdog asked) so a later one continues.

Running training runs are checkpointed and stopped (their servers resume from the checkpoint in the
next window); the study's phase becomes ``parked`` and ``parked.phase`` remembers where to re-enter.
The study's absolute deadline and budgets are untouched: they apply across windows.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from researcher.runs import record as runs
from researcher.runs.status import RunStatus
from researcher.session.context import StudyContext
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, Trial, sync_trial

log = logging.getLogger(__name__)


def park(state: StudyState, ctx: StudyContext) -> StudyState:
    reason = ctx.should_park() or "parked"
    trials: list[Trial] = [t.copy() for t in state.get("trials") or []]
    parked_runs = []
    for trial in trials:
        if trial["status"] != RunStatus.RUNNING:
            continue
        run_dir = Path(trial["run_dir"])
        record = runs.load(run_dir)
        if record is None or record.ended:
            continue
        sync_trial(trial, ctx.launcher.park(run_dir, record, reason))
        parked_runs.append(f"{record.key} at step {record.last_step}")
    phase = state.get("phase") or "framing"
    note = (f"Parked in phase {phase} (iteration {state.get('iteration', 0)}): {reason}. "
            + (f"Checkpointed and stopped runs: {', '.join(parked_runs)}. " if parked_runs else "")
            + "The next session resumes from here.")
    try:
        studyfiles.log(ctx.layout, note)
    except OSError as exc:  # a full disk (one reason to park): the study parks all the same
        log.warning("could not write LOG.md (%s): %s", exc, note)
    ctx.say("parked", reason=reason, phase=phase, runs=len(parked_runs))
    return {"trials": trials, "phase": "parked",
            "parked": {"phase": phase, "reason": reason, "at": time.time(), "runs": parked_runs}}
