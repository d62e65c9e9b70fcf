"""A goal campaign's stages as studies: each stage the search asks for (``discovery.Discovery.next_stage``)
becomes a claim of the campaign, an ordinary study started with its arms given (``--design``), and what
the study found goes back into the search when it ends.

Sizing: before a stage starts, its cost is estimated from the run times measured so far (arms x seeds x
looks x seconds a run, over the runs the campaign keeps alive at once), keeping back the final
verification's first look (a study the budget gives no further look decides at its pilot). A stage that
does not fit runs with fewer seeds (two an arm at least); one that
still does not fit ends the search, and the ledger says so before anything runs. A screen is read only
once its study has ended: a screen cut by the budget is never analysed.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from researcher.campaign import discovery, proposals
from researcher.campaign.discovery import Comparison, Discovery, Effect, Knob, Stage
from researcher.campaign.goal import Goal
from researcher.campaign.record import CampaignRecord, ClaimRecord, claim_study_id
from researcher.campaign.spec import CampaignSpec, Claim
from researcher.findings.records import Evidence, arm_key
from researcher.planner import catalog, screen
from researcher.planner.designed import Design, DesignArm, topic_for
from researcher.runs import record as runs
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState, last_summary
from researcher.types.design import Factor

MIN_SEEDS = 2
SEEDS = {"screen": 2, "refine": 2}  # selections: one look; comparisons take the campaign's seeds and looks
SIZE_KNOBS = ("group_size", "batch_groups")  # fair only per episode consumed
# A run's seconds before any was measured: a start-up and a few seconds a step (a letters run of 30 steps took
# about 120 s on 2 busy cores).
FIRST_GUESS_START_S, FIRST_GUESS_STEP_S = 30.0, 3.0
STUDY_STEPS = 30  # StudyOptions.steps_per_run's default


def start(goal: Goal, examples_root: Path, min_effect: float) -> Discovery:
    """The search's first state: the task's catalog knobs (group and batch size first, when the objective is
    per episode consumed), at most a screen's worth, starting from the task's own settings."""
    example = catalog.examples(examples_root)[goal.task]
    config = tomllib.loads(example.config.read_text())
    chosen = screen.knobs(goal.task)
    if goal.objective == "episode":
        chosen = [catalog.knob(k) for k in SIZE_KNOBS] + chosen
    chosen = chosen[:screen.MAX_KNOBS]
    knobs = [Knob(key=k.key, ladder=list(k.ladder), down_only=k.key in SIZE_KNOBS) for k in chosen]
    defaults = {k.key: config.get(k.key, k.reference if k.reference is not None else k.first[0]) for k in chosen}
    return Discovery(knobs=knobs, defaults=defaults, min_effect=min_effect)


def advance(spec: CampaignSpec, rec: CampaignRecord, studies_root: Path, artifacts_root: Path,
            proposer: proposals.Proposer | None = None) -> None:
    """Give the search's next stage a claim, sized to the budget, unless one is open; end the campaign once
    the search has nothing left to run. ``proposer`` (an LLM's, where one is configured) adds its hypotheses
    to each round before its screen."""
    d = rec.discovery
    if d is None or rec.ended or any(not c.closed for c in rec.claims):
        return
    while (stage := d.next_stage()) is not None:
        if stage.kind == "screen" and proposer is not None and d.proposals_asked < d.round:
            d.proposals_asked = d.round
            offered, refused = proposer(d)
            taken = d.propose(offered)
            refused += [f"{p.knob} = {catalog.show(p.value)}: the screen tests it, it repeats the incumbent or "
                        "another proposal, or the round has its share" for p in offered if p not in taken]
            rec.notes.append(proposals.note(d.round, taken, refused))
        comparison_looks = min(spec.campaign.max_iterations or 3, 9)
        looks = 1 if stage.kind in SEEDS else comparison_looks
        seeds = SEEDS.get(stage.kind, spec.campaign.seeds or 3)
        run_s = measured_run_s(rec, studies_root, artifacts_root, spec.campaign.steps_per_run or STUDY_STEPS)
        parallel = spec.campaign.parallel_runs or 2
        # The final verification's first look is kept back: it is the headline, and a study whose budget runs
        # no further look makes its pilot its only look.
        reserve = 0.0 if stage.kind == "verify" else _cost(2, spec.campaign.seeds or 3, 1, run_s, parallel)
        cost = _cost(len(stage.arms), seeds, looks, run_s, parallel)
        while cost + reserve > rec.left_s and seeds > MIN_SEEDS:
            seeds -= 1
            cost = _cost(len(stage.arms), seeds, looks, run_s, parallel)
        if cost + reserve <= rec.left_s:
            _add_claim(spec, rec, stage, seeds, looks)
            return
        why = (f"round {stage.round}'s {stage.kind} needs about {cost / 60:.0f} min at {seeds} seeds an arm "
               f"({len(stage.arms)} arms, {run_s:.0f} s a run), and {rec.left_s / 60:.0f} min are left")
        rec.notes.append(f"Not started: {why}.")
        if stage.kind == "verify":
            break
        d.stop(f"the budget ended the search ({why})")
    rec.ended = f"{d.converged or 'the search ended'}. {d.headline()}"


def _cost(arms: int, seeds: int, looks: int, run_s: float, parallel: int) -> float:
    return math.ceil(arms * seeds * looks / max(parallel, 1)) * run_s


def measured_run_s(rec: CampaignRecord, studies_root: Path, artifacts_root: Path, steps: int) -> float:
    """The mean wall seconds of the campaign's finished runs so far (before any: a guess for runs of ``steps``)."""
    walls = [r.wall_s for c in rec.claims
             for r in runs.all_records(StudyLayout(c.study_id, studies_root, artifacts_root).runs_dir)
             if r.wall_s is not None and r.status == "finished"]
    return sum(walls) / len(walls) if walls else FIRST_GUESS_START_S + FIRST_GUESS_STEP_S * steps


def _add_claim(spec: CampaignSpec, rec: CampaignRecord, stage: Stage, seeds: int, looks: int) -> None:
    assert rec.goal is not None
    design = design_for(stage, rec.goal.task, rec.discovery)
    claim = Claim(topic=topic_for(design), expect="stage", source=f"round {stage.round}: {stage.kind}",
                  design=design.model_dump(), alpha=min(2 * stage.alpha, 0.49) if stage.alpha else None,
                  seed_base=stage.seed_base, seeds=seeds, max_iterations=looks, min_effect=stage.min_effect)
    rec.added.append(claim.model_dump(exclude_none=True))
    spec.claim.append(claim)
    index = len(rec.claims)
    rec.claims.append(ClaimRecord(index=index, study_id=claim_study_id(rec.name, index), task=rec.goal.task,
                                  stage=stage))


def design_for(stage: Stage, task: str, d: Discovery | None) -> Design:
    """The stage's arms as a study design: a screen's factorial (its factors the screen levels), or a
    comparison with the control first."""
    if stage.kind == "screen" and d is not None:
        factors = [Factor(name=key, where="server", levels=pair) for key, pair in d.screen_factors()]
        factors.sort(key=lambda f: f.name not in SIZE_KNOBS)  # judged per episode when sizes vary
        return Design(task=task, shape="factorial", factors=factors, why=f"round {stage.round}'s screen around the "
                      "incumbent", arms=[DesignArm(name=f"arm{i + 1}", overrides=a) for i, a in enumerate(stage.arms)])
    names = {"confirm": ("incumbent", "change"), "combine": ("incumbent", "combination"), "verify": ("baseline", "best")}
    if stage.kind == "refine":
        arms = [DesignArm(name=_slug(f"{stage.knob}-{catalog.show(a[stage.knob or ''])}"), overrides=a) for a in stage.arms]
    else:
        arms = [DesignArm(name=n, overrides=a) for n, a in zip(names[stage.kind], stage.arms, strict=True)]
    return Design(task=task, arms=arms, why=f"round {stage.round}'s {stage.kind}")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in text.lower())[:50]


def record_outcome(rec: CampaignRecord, claim: ClaimRecord, state: StudyState) -> None:
    """A stage's study ended: what it found goes into the search (a study that failed finds nothing)."""
    d, stage = rec.discovery, claim.stage
    if d is None or stage is None or claim.recorded:
        return
    claim.recorded = True
    last = last_summary(state)
    study = last.study if last and claim.phase == "done" else None
    if stage.kind == "screen":
        effects = [Effect(knob=e.name, low=e.levels[0][0], high=e.levels[0][1], estimate=e.estimate or 0.0,
                          resolved=e.resolved, hw=e.hw) for e in (study.effects if study else []) if e.kind == "main"]
        if study is None:
            rec.notes.append(f"Round {stage.round}'s screen ({claim.study_id}) ended {claim.phase}: nothing to read.")
        arms = {discovery.describe({**d.incumbent, **a.overrides}, d.defaults): a.axes[study.axis].mean
                for a in study.arms if study.axis in a.axes} if study else {}
        d.record_screen(effects, arms)
    elif stage.kind == "refine":
        best = _arm(study, stage.arms, study.best) if study and study.best else None
        d.record_refine(best[stage.knob or ""] if best else d.refining[0].value)
    else:
        d.record_comparison(_comparison(study, stage))
    rec.notes.append(_line(d, stage, claim))


def _arm(study: Evidence, configs: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The stage's configuration whose study arm is ``name``."""
    arm = next((a for a in study.arms if a.name == name), None)
    return next((c for c in configs if arm is not None and arm_key(c) == arm_key(arm.overrides)), None)


def _comparison(study: Evidence | None, stage: Stage) -> Comparison:
    """Treatment minus control as the study's verdict compared them, with the interval of its last look
    (no study, or no comparison: an interval that holds nothing)."""
    c = study.comparison if study else None
    if study is None or c is None:
        return Comparison(diff=0.0, low=-math.inf, high=math.inf)
    treatment_ahead = _arm(study, stage.arms, c.better) == stage.arms[1]
    diff = c.diff if treatment_ahead else -c.diff
    hw = c.hw if c.hw is not None else math.inf
    means = {arm_key(a.overrides): a.axes[study.axis].mean for a in study.arms if study.axis in a.axes}
    return Comparison(diff=diff, low=diff - hw, high=diff + hw, control=means.get(arm_key(stage.arms[0])),
                      treatment=means.get(arm_key(stage.arms[1])))


def _line(d: Discovery, stage: Stage, claim: ClaimRecord) -> str:
    """What the stage did to the search, for the ledger."""
    where = f"Round {stage.round} {stage.kind} (`{claim.study_id}`)"
    if stage.kind == "screen":
        flagged = ", ".join(f"{c.knob}={catalog.show(c.value)}" for c in d.flagged) or "nothing"
        return f"{where}: flagged {flagged}."
    if stage.kind == "refine":
        return f"{where}: {d.refined[-1].knob} = {catalog.show(d.refined[-1].value)} is best."
    t = d.tests[-1]
    changed = ", ".join(f"{c.knob}={catalog.show(c.value)}" for c in t.changes)
    outcome = "holds" if t.held else "does not hold"
    return (f"{where}: {changed} {outcome} ({t.diff:+.3f}, bounds {t.low:+.3f} to {t.high:+.3f} at one-sided level "
            f"{t.alpha:.4f}); incumbent now {discovery.describe(d.incumbent, d.defaults)}.")
