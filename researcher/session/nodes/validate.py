"""validate: check the client before any training run: compile → import check → static contract →
data probe → smoke run on a real swarm server → reward checks (``researcher.runs.preflight``).

The import check (``researcher.runs.sandbox.check_client``) runs before any of the code does: a client
importing ``subprocess`` never reaches the probe or the smoke run; the static contract is read from
the source too. Everything that executes study code (the probe, the smoke run) runs boxed, in the OS
sandbox where the machine has one (``swarm run --box``); LLM-written code is refused where it has none,
unless the study allows it (``allow_unboxed``). A denial the sandbox reports in the smoke run is a
``sandbox_violation`` event and fails the attempt. A failure
records its error, whose first line is the precise verdict and the rest the evidence (violations, the
log tail), for the planner's repair round (``validation["error"]`` is what ``repair_client`` sees);
LOG.md records which checks passed. After ``max_repairs`` failed rounds the study fails with the last error.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from researcher.runs import logs, preflight, sandbox
from researcher.runs.preflight import Failure
from researcher.session.context import StudyContext
from researcher.study import files as studyfiles
from researcher.study.state import StudyState, Validation, study_options

FULL_BYTES = 16 * 2**20  # below this free under the artifacts, a failed probe or smoke run is the disk's doing


def validate(state: StudyState, ctx: StudyContext) -> StudyState:
    if state.get("phase") == "failed":
        return {}  # write_client refused the plan: nothing to validate, the report follows
    plan = studyfiles.read_plan(ctx.layout).iteration(state["iteration"])
    first = plan.experiments[0].name
    folder = ctx.layout.experiment_dir(first)
    refusal = sandbox.unboxed_refusal(llm_written=ctx.planner.name != "offline",
                                      allow_unboxed=study_options(state).allow_unboxed)
    if refusal is not None:  # no repair round can help: the machine, not the code, is the problem
        studyfiles.log(ctx.layout, f"Refused to run the client: {refusal}")
        return {"phase": "failed", "error": refusal}
    validation = Validation(**(state.get("validation") or {"attempts": 0, "ok": False, "error": None}))
    attempt = validation.get("attempts", 0) + 1
    passed: list[str] = []
    failure = _check(folder / "client.py", folder / "config.toml", state, ctx, attempt, passed)
    if failure is not None and failure.check in ("data probe", "smoke run") and _for_want_of_space(failure, ctx):
        # Not the client's fault: its probe or smoke server had no room. The graph parks the study
        # (a full disk) and the next session validates again, with no repair round spent.
        raise OSError(errno.ENOSPC, f"the {failure.check} failed on a full disk: {failure.message[:200]}")
    if failure is None:
        studyfiles.log(ctx.layout, f"Validation attempt {attempt} passed: {'; '.join(passed)}.")
        ctx.say("validated", attempt=attempt, ok=True)
        return {"validation": {"attempts": attempt, "ok": True, "error": None}, "phase": "running"}
    error = failure.text
    so_far = f"; passed: {', '.join(p.split(' (')[0] for p in passed)}" if passed else ""
    studyfiles.log(ctx.layout, f"Validation attempt {attempt} FAILED: {failure.message[:400]} "
                               f"(at the {failure.check}{so_far})")
    ctx.say("validated", attempt=attempt, ok=False, error=failure.message[:200])
    if attempt > state["budget"]["max_repairs"]:
        return {"validation": {"attempts": attempt, "ok": False, "error": error}, "phase": "failed",
                "error": f"the client still failed validation after {attempt} attempts:\n{error[-2000:]}"}
    return {"validation": {"attempts": attempt, "ok": False, "error": error}, "phase": "writing"}


def _for_want_of_space(failure: Failure, ctx: StudyContext) -> bool:
    """The disk under the artifacts is (nearly) full now, or the failure's evidence says it was."""
    text = failure.text.lower()
    return shutil.disk_usage(ctx.layout.artifacts_dir).free < FULL_BYTES or any(
        words in text for words in ("no space left on device", "disk is full", "disk_full", "insufficient storage"))


def _check(client: Path, config: Path, state: StudyState, ctx: StudyContext, attempt: int,
           passed: list[str]) -> Failure | None:
    """Run the checks in order, appending a note to ``passed`` for each that passes; the first failure."""
    source = client.read_text()
    failure = preflight.compile_check(source, client.name)
    if failure is not None:
        return failure
    passed.append("compiled")
    failure = preflight.import_check(source, client.name)
    if failure is not None:
        return failure
    passed.append("import check")
    contract = preflight.check_contract(source, client.name)
    if isinstance(contract, Failure):
        return contract
    reward_range = contract
    passed.append(f"static contract (REWARD_RANGE = ({reward_range[0]:g}, {reward_range[1]:g}))")
    work_dir = ctx.layout.smoke_dir(state["iteration"], attempt)
    probe = preflight.run_probe(client, work_dir, ctx.launcher.swarm_command, threads=ctx.launcher.threads,
                                read=ctx.launcher.box_read)
    if isinstance(probe, Failure):
        return probe
    passed.append(f"data probe (tasks(seed) deterministic and seed-dependent over the first {probe.tasks_per_seed} "
                  f"tasks of seeds {', '.join(map(str, probe.seeds))}; {probe.heldout} held-out tasks, disjoint)")
    options = study_options(state)
    episodes, group = preflight.smoke_size(options.smoke_episodes)
    rewards_file = work_dir / preflight.REWARDS_FILE
    server = ctx.settings.servers[0] if ctx.settings.servers else None
    smoke_error = ctx.launcher.smoke(client, config, work_dir, episodes=episodes, group_size=group,
                                     timeout_s=options.smoke_timeout_s, server_url=server,
                                     rewards_out=rewards_file)
    escapes = logs.VIOLATION.findall(logs.tail(work_dir / logs.CLIENT_LOG, 4000))
    for what in escapes:
        ctx.say("sandbox_violation", key="smoke", iteration=state["iteration"], attempt=attempt, what=what)
    if escapes:
        return Failure("sandbox", f"the client tried to leave its sandbox: {escapes[0]}", "\n".join(escapes[1:]))
    records = preflight.read_rewards(rewards_file)
    # Rewards outside the range explain an abort (a NaN is refused) better than the abort count does.
    failure = preflight.check_rewards(records, reward_range)
    if failure is not None:
        return failure
    if smoke_error is not None:
        first_line, _, rest = smoke_error.strip().partition("\n")
        return Failure("smoke run", first_line, rest)
    passed.append(f"smoke run ({episodes} episodes in groups of {group} on a real server)")
    example = preflight.example_name(source, ctx.settings.examples_root)
    if example is None:
        failure = preflight.check_variation(records)
        if failure is not None:
            return failure
    exempt = f"; the {example} example unchanged, exempt from the constant-reward check" if example else ""
    passed.append(f"reward checks (inside REWARD_RANGE: {preflight.reward_summary(records)}{exempt})")
    return None
