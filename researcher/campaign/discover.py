"""A goal campaign's stages as studies: each stage the search asks for (``discovery.Discovery.next_stage``)
becomes a claim of the campaign, an ordinary study started with its arms given (``--design``), and what
the study found goes back into the search when it ends.

Sizing: before a stage starts, its cost is estimated from the seconds an episode took so far (``Pricing``:
seeds x looks x each arm's run, over the runs the campaign keeps alive at once), keeping back the final
verification's first look (a study the budget gives no further look decides at its pilot). Before a
round's first confirmation, where confirming each flag, refining and combining them cannot fit, the
flags are tested together, as one combination. A stage that does not fit runs with fewer seeds (two an
arm at least); one that still does not fit ends the search, and the ledger says so before anything runs.
A screen is read only once its study has ended with every arm's runs: a screen cut by the budget is
never analysed. The run length is fixed before the first stage (``_run_length``).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from researcher.campaign import proposals
from researcher.campaign.discovery import Comparison, Discovery, Effect, Knob, Stage
from researcher.campaign.goal import Goal
from researcher.campaign.levels import MIN_LEVELS, Config, describe, screen_arms
from researcher.campaign.record import CampaignRecord, ClaimRecord, claim_study_id
from researcher.campaign.spec import CampaignSpec, Claim
from researcher.findings.records import Evidence, arm_key
from researcher.planner import arm_budgets, catalog, screen
from researcher.planner.designed import Design, DesignArm, topic_for
from researcher.runs import record as runs
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState, last_summary, study_options
from researcher.types.design import Factor

MIN_SEEDS = 2
SEEDS = {"screen": 2, "refine": 2}  # selections: one look; comparisons take the campaign's seeds and looks
SIZE_KNOBS = ("group_size", "batch_groups")  # fair only per episode consumed
# A run's seconds: a start-up, then its episodes at the rate measured so far, or before any run at this guess (a
# letters run of 30 steps of 32 episodes took about 120 s on 2 busy cores: 0.094 s an episode).
RUN_START_S, FIRST_GUESS_EPISODE_S = 30.0, 0.094
STUDY_STEPS = 30  # StudyOptions.steps_per_run's default
RUN_LENGTHS = (STUDY_STEPS, 20)  # a goal campaign's runs, longest first: 20 steps keep 4 held-out rounds


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
        price = _pricing(spec, rec, studies_root, artifacts_root)
        # The final verification's first look is kept back: it is the headline, and a study whose budget runs
        # no further look makes its pilot its only look.
        reserve = 0.0 if stage.kind == "verify" else price.cost([d.defaults, d.incumbent], spec.campaign.seeds or 3, 1)
        if stage.kind == "confirm" and _tested_together(d, rec, price.cost(stage.arms, seeds, looks),
                                                        price.cost(stage.arms[1:] * MIN_LEVELS, SEEDS["refine"], 1),
                                                        reserve):
            continue
        cost = price.cost(stage.arms, seeds, looks)
        while cost + reserve > rec.left_s and seeds > MIN_SEEDS:
            seeds -= 1
            cost = price.cost(stage.arms, seeds, looks)
        if cost + reserve <= rec.left_s:
            _add_claim(spec, rec, stage, seeds, looks)
            return
        run_s = sum(price.run_s(stage.arms)) / len(stage.arms)
        why = (f"round {stage.round}'s {stage.kind} needs about {cost / 60:.0f} min at {seeds} seeds an arm "
               f"({len(stage.arms)} arms, {run_s:.0f} s a run), and {rec.left_s / 60:.0f} min are left")
        rec.notes.append(f"Not started: {why}.")
        if stage.kind == "verify":
            break
        d.stop(f"the budget ended the search ({why})")
    rec.ended = f"{d.converged or 'the search ended'}. {d.headline()}"


def _tested_together(d: Discovery, rec: CampaignRecord, compare_s: float, refine_s: float, reserve_s: float) -> bool:
    """Before a round's first confirmation: where confirming each flag, refining each and combining them cannot
    fit the budget left, the flags are tested together instead (``Discovery.confirm_together``), and the ledger
    says so. ``compare_s`` and ``refine_s``: one comparison's and one refinement's estimated seconds."""
    if d.together or len(d.flagged) < 2 or any(t.round == d.round and t.kind == "confirm" for t in d.tests):
        return False
    one_by_one = compare_s * (len(d.flagged) + 1) + refine_s * len(d.flagged)
    if one_by_one + reserve_s <= rec.left_s:
        return False
    rec.notes.append(f"Round {d.round}: confirming its {len(d.flagged)} flags one by one, then refining and combining "
                     f"them, needs about {one_by_one / 60:.0f} min, and {rec.left_s / 60:.0f} min are left; they are "
                     "tested together, as one combination.")
    d.confirm_together()
    return True


@dataclass(frozen=True)
class Pricing:
    """What a stage's runs cost: seconds an episode takes to train on (measured, else a guess), past a run's
    start-up; the run length in steps at the largest batch; the runs the campaign keeps alive at once. A run
    costs its episodes: per episode consumed, every arm trains to the same episodes (``arm_budgets.matched``);
    per step, an arm with larger batches consumes more."""

    episode_s: float
    steps: int
    parallel: int
    per_episode: bool
    max_runs: int = 16  # StudyOptions.max_runs: a study with further looks may launch this many runs

    def run_s(self, arms: Sequence[Config]) -> list[float]:
        """Each arm's estimated seconds a run."""
        if self.per_episode:
            budgets = arm_budgets.matched({str(i): a for i, a in enumerate(arms)}, self.steps, 1)
            episodes = [budgets[str(i)].episodes for i in range(len(arms))]
        else:
            episodes = [self.steps * arm_budgets.episodes_per_step(a) for a in arms]
        return [RUN_START_S + self.episode_s * n for n in episodes]

    def cost(self, arms: Sequence[Config], seeds: int, looks: int) -> float:
        """Seconds a stage of these arms takes at ``seeds`` an arm and ``looks`` looks: one look runs its seeds;
        further looks add the seeds its pilot asks for, up to the study's ``max_runs`` (letters' confirmations
        took 2 seeds an arm, then 8)."""
        per_arm = seeds if looks == 1 else max(seeds, self.max_runs / max(len(arms), 1))
        return per_arm * sum(self.run_s(arms)) / max(self.parallel, 1)


def _pricing(spec: CampaignSpec, rec: CampaignRecord, studies_root: Path, artifacts_root: Path) -> Pricing:
    """The campaign's pricing now; its run length is fixed once, before the first stage (``_run_length``)."""
    d = rec.discovery
    assert d is not None and rec.goal is not None
    price = Pricing(episode_s=measured_episode_s(rec, studies_root, artifacts_root), steps=STUDY_STEPS,
                    parallel=spec.campaign.parallel_runs or 2, per_episode=rec.goal.objective == "episode",
                    max_runs=spec.campaign.max_runs or 16)
    if spec.campaign.steps_per_run:
        return dataclasses.replace(price, steps=spec.campaign.steps_per_run)
    if d.steps is None:
        d.steps = _run_length(price, d, rec, spec.campaign.seeds or 3)
    return dataclasses.replace(price, steps=d.steps)


def _run_length(price: Pricing, d: Discovery, rec: CampaignRecord, seeds: int) -> int:
    """The longest run (of ``RUN_LENGTHS``) at which the least whole round fits the budget: its screen, one
    comparison (its flags together) and the verification's first look; the shortest where none does. The
    ledger says when runs are shorter than a study's default: every stage's objective is read over this one
    length, so it is fixed before the first stage."""
    screen = [{**d.incumbent, **a} for a in screen_arms(d.screen_factors())]

    def least_round_s(steps: int) -> float:
        priced, pair = dataclasses.replace(price, steps=steps), [d.incumbent, d.incumbent]
        return priced.cost(screen, SEEDS["screen"], 1) + priced.cost(pair, seeds, 2) + priced.cost(pair, seeds, 1)

    steps = next((n for n in RUN_LENGTHS if least_round_s(n) <= rec.left_s), RUN_LENGTHS[-1])
    if steps < STUDY_STEPS:
        whole = least_round_s(STUDY_STEPS)
        rec.notes.append(f"Runs of {steps} steps, not {STUDY_STEPS}: a whole round at {STUDY_STEPS} needs about "
                         f"{whole / 60:.0f} min, and the budget is {rec.left_s / 60:.0f} min.")
    return steps


def measured_episode_s(rec: CampaignRecord, studies_root: Path, artifacts_root: Path) -> float:
    """The mean seconds an episode took in the campaign's finished runs, past a run's start-up (before any
    run: a guess)."""
    per_episode = [max((r.wall_s - RUN_START_S) / (r.last_step * arm_budgets.episodes_per_step(r.config)), 1e-3)
                   for c in rec.claims for r in runs.all_records(StudyLayout(c.study_id, studies_root, artifacts_root).runs_dir)
                   if r.wall_s is not None and r.status == "finished" and r.last_step > 0]
    return sum(per_episode) / len(per_episode) if per_episode else FIRST_GUESS_EPISODE_S


def _add_claim(spec: CampaignSpec, rec: CampaignRecord, stage: Stage, seeds: int, looks: int) -> None:
    assert rec.goal is not None
    design = design_for(stage, rec.goal.task, rec.discovery)
    claim = Claim(topic=topic_for(design), expect="stage", source=f"round {stage.round}: {stage.kind}",
                  design=design.model_dump(), alpha=min(2 * stage.alpha, 0.49) if stage.alpha else None,
                  seed_base=stage.seed_base, seeds=seeds, max_iterations=looks, min_effect=stage.min_effect,
                  steps_per_run=None if spec.campaign.steps_per_run else rec.discovery.steps)  # type: ignore[union-attr]
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
    seeds = study_options(state).seeds
    if stage.kind == "screen" and not _complete(study, stage, seeds):
        rec.notes.append(f"Round {stage.round}'s screen ({claim.study_id}) ended {claim.phase} before each of its "
                         f"{len(stage.arms)} arms had {seeds} usable runs: it is not read.")
        d.record_screen_cut(f"round {stage.round}'s screen did not complete (the budget cut its runs, or they failed)")
        return
    if stage.kind == "screen":
        assert study is not None  # complete: every arm has its runs
        effects = [Effect(knob=e.name, low=e.levels[0][0], high=e.levels[0][1], estimate=e.estimate or 0.0,
                          resolved=e.resolved, hw=e.hw) for e in study.effects if e.kind == "main"]
        arms = {describe({**d.incumbent, **a.overrides}, d.defaults): a.axes[study.axis].mean
                for a in study.arms if study.axis in a.axes}
        d.record_screen(effects, arms)
    elif stage.kind == "refine":
        best = _arm(study, stage.arms, study.best) if study and study.best else None
        d.record_refine(best[stage.knob or ""] if best else d.refining[0].value)
    else:
        d.record_comparison(_comparison(study, stage))
    rec.notes.append(_line(d, stage, claim))


def _complete(study: Evidence | None, stage: Stage, seeds: int) -> bool:
    """Every arm of the stage has ``seeds`` usable runs on the study's verdict axis."""
    if study is None:
        return False
    usable = {arm_key(a.overrides) for a in study.arms if study.axis in a.axes and a.axes[study.axis].n >= seeds}
    return all(arm_key(config) in usable for config in stage.arms)


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
            f"{t.alpha:.4f}); incumbent now {describe(d.incumbent, d.defaults)}.")
