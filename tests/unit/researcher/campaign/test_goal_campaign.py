"""A goal campaign's parts that need no run: the goal read into a task and an objective (or refused with
what was understood), the stages as study designs whose topics read as what they test, the first search
state from a task's own settings, and a stage the budget cannot fit ending the search before it runs."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from researcher.campaign import discover, figures, goal, ledger, spec
from researcher.campaign.discovery import Discovery, Effect, Knob, Stage
from researcher.campaign.record import CampaignRecord
from researcher.findings.records import Arm, Cell, Evidence
from researcher.planner import topic
from researcher.planner.designed import Design, DesignedPlanner, topic_for
from researcher.planner.offline import OfflinePlanner

EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"
TASKS = ["calculator", "digits", "letters", "tools"]


def test_a_goal_is_read_into_a_task_and_an_objective_or_refused_with_what_was_understood() -> None:
    default = goal.read("Make the letters task learn faster", TASKS)
    assert (default.task, default.objective) == ("letters", "episode")
    assert default.describe() == "the letters task, its held-out reward AUC per episode consumed"
    assert goal.read("Faster digits learning per training step", TASKS).objective == "step"
    for text, words in (("Make it learn faster", "names no task (understood: task (none named)"),
                        ("Make letters and digits learn faster", "names 2 tasks"),
                        ("Make letters learn faster per wall-clock second", "wall-clock time is no fair judge"),
                        ("Maximise the final reward after 40 steps on letters", "objective its final held-out reward "
                                                                                "after 40 steps")):
        with pytest.raises(goal.GoalNotMappable, match=re.escape(words)):
            goal.read(text, TASKS)
    parsed = spec.parse('[campaign]\nname = "g"\ngoal = "Make the letters task learn faster"\nseeds = 2\n')
    assert parsed.campaign.goal and not parsed.claim


def test_the_search_starts_from_the_tasks_own_settings_and_screens_sizes_downwards_only() -> None:
    d = discover.start(goal.read("Make the letters task learn faster", TASKS), EXAMPLES, 0.02)
    keys = [k.key for k in d.knobs]
    assert keys[:2] == ["group_size", "batch_groups"] and "lr" in keys and len(keys) == 7
    assert d.defaults["lr"] == 1e-3 and d.defaults["group_size"] == 8 and d.defaults["kl_coef"] == 0.0
    factors = dict(d.screen_factors())
    assert factors["group_size"] == [4, 8] and factors["batch_groups"] == [2, 4] and factors["lr"] == [3e-4, 3e-3]
    per_step = discover.start(goal.read("Make letters learn faster per training step", TASKS), EXAMPLES, 0.02)
    assert "group_size" not in [k.key for k in per_step.knobs]  # sizes compare fairly only per episode


@pytest.mark.parametrize("kind", ["screen", "confirm", "refine", "combine", "verify"])
def test_every_stage_is_a_study_whose_topic_reads_as_what_it_runs(kind: str) -> None:
    d = discover.start(goal.read("Make the letters task learn faster", TASKS), EXAMPLES, 0.02)
    base = dict(d.incumbent)
    arms = {"screen": None, "confirm": [base, {**base, "lr": 3e-3}],
            "refine": [{**base, "lr": v} for v in (1e-3, 3e-3, 1e-2)],
            "combine": [base, {**base, "lr": 3e-3, "group_size": 4}], "verify": [base, {**base, "policy_loss": "gspo"}]}
    stage = d.next_stage() if kind == "screen" else Stage(round=1, kind=kind, arms=arms[kind], seed_base=20_000,  # type: ignore[arg-type]
                                                           knob="lr" if kind == "refine" else None)
    assert stage is not None
    design = Design.model_validate(discover.design_for(stage, "letters", d).model_dump())
    text = topic_for(design)
    planner = DesignedPlanner(design, OfflinePlanner(TASKS))
    framing = planner.frame(text, "").value
    question = topic.on_task(topic.parse(text), framing.task)
    assert topic.framing_complaint(question, framing.knob, framing.task) is None
    for iteration in (1, 2):
        plan = planner.plan(framing, {"iteration": iteration}).value
        assert [e.overrides for e in plan.experiments] == [a.overrides for a in design.arms]
        assert all(e.name.startswith(f"it{iteration}-") for e in plan.experiments)
        assert topic.plan_complaint(question, framing.knob, [e.overrides for e in plan.experiments]) is None
    if kind == "combine":  # a change of group size is judged per episode consumed: it leads the design
        assert framing.knob == "group_size" and "group_size = 8 or group_size = 4" in text
    if kind == "screen":
        assert design.shape == "factorial" and framing.factors[0].name == "group_size" and len(plan.experiments) == 8


def test_a_stage_the_budget_cannot_fit_ends_the_search_before_it_runs(tmp_path: Path) -> None:
    d = Discovery(knobs=[Knob(key="lr", ladder=[1e-4, 1e-3, 1e-2]), Knob(key="kl_coef", ladder=[0.0, 0.1])],
                  defaults={"lr": 1e-3, "kl_coef": 0.0})
    parsed = spec.parse('[campaign]\nname = "g"\ngoal = "Make the letters task learn faster"\n')
    rec = CampaignRecord(name="g", budget_s=300.0, study_deadline=0.0, claims=[],
                         goal=goal.read("Make the letters task learn faster", TASKS), discovery=d)
    discover.advance(parsed, rec, tmp_path / "studies", tmp_path / "artifacts")
    assert not rec.claims and rec.ended is not None
    # Runs are first shortened to the shortest length (no whole round fits), then the screen still does not fit.
    assert d.steps == 20
    assert rec.notes == ["Runs of 20 steps, not 30: a whole round at 30 needs about 30 min, and the budget is 5 min.",
                         "Not started: round 1's screen needs about 6 min at 2 seeds an arm (4 arms, 90 s a run), "
                         "and 5 min are left."]
    assert "Nothing beat the baseline: the budget ended the search" in rec.ended
    text = ledger.render(parsed, rec)
    assert "Goal: Make the letters task learn faster (read as the letters task" in text and "Not started: " in text


def test_a_confirmation_is_sized_to_the_effect_its_screen_saw(tmp_path: Path) -> None:
    """A flagged change's study resolves half the screen's estimate, not the campaign's minimum."""
    d = Discovery(knobs=[Knob(key="lr", ladder=[1e-4, 1e-3, 1e-2]), Knob(key="kl_coef", ladder=[0.0, 0.1])],
                  defaults={"lr": 1e-3, "kl_coef": 0.0})
    d.record_screen([Effect(knob="lr", low=1e-4, high=1e-2, estimate=0.12, resolved=True)])
    parsed = spec.parse('[campaign]\nname = "g"\ngoal = "Make the letters task learn faster"\nmin_effect = 0.02\n')
    rec = CampaignRecord(name="g", budget_s=36000.0, study_deadline=0.0, claims=[],
                         goal=goal.read("Make the letters task learn faster", TASKS), discovery=d)
    discover.advance(parsed, rec, tmp_path / "studies", tmp_path / "artifacts")
    assert [c.stage.kind for c in rec.claims] == ["confirm"]  # type: ignore[union-attr]
    assert parsed.knobs(0)["min_effect"] == pytest.approx(0.06)
    assert d.steps == 30 and parsed.knobs(0)["steps_per_run"] == 30  # a whole round fits at the default length


def test_flags_a_round_cannot_fit_one_by_one_are_tested_together(tmp_path: Path) -> None:
    d = Discovery(knobs=[Knob(key="lr", ladder=[1e-4, 1e-3, 1e-2]), Knob(key="kl_coef", ladder=[0.0, 0.1]),
                         Knob(key="temperature", ladder=[0.7, 1.0, 1.3])],
                  defaults={"lr": 1e-3, "kl_coef": 0.0, "temperature": 1.0})
    d.record_screen([Effect(knob="lr", low=1e-4, high=1e-2, estimate=0.12, resolved=True),
                     Effect(knob="temperature", low=0.7, high=1.3, estimate=0.06, resolved=True)])
    parsed = spec.parse('[campaign]\nname = "g"\ngoal = "Make the letters task learn faster"\nsteps_per_run = 30\n')
    # 120 s a run, 2 at once: a comparison with further looks may take 16 runs (16 min), a refinement 6 runs.
    rec = CampaignRecord(name="g", budget_s=1800.0, study_deadline=0.0, claims=[],
                         goal=goal.read("Make the letters task learn faster", TASKS), discovery=d)
    discover.advance(parsed, rec, tmp_path / "studies", tmp_path / "artifacts")
    assert [c.stage.kind for c in rec.claims] == ["combine"]  # type: ignore[union-attr]
    assert rec.claims[0].stage.arms[1] == {"lr": 1e-2, "kl_coef": 0.0, "temperature": 1.3}  # type: ignore[union-attr]
    assert rec.notes[0].startswith("Round 1: confirming its 2 flags one by one, then refining and combining them, "
                                   "needs about 60 min, and 30 min are left")
    roomy = Discovery.model_validate(d.model_dump() | {"together": False, "step": "confirm", "tests": []})
    roomy.refined, roomy.flagged = [], d.refined
    rec = CampaignRecord(name="g", budget_s=36000.0, study_deadline=0.0, claims=[],
                         goal=goal.read("Make the letters task learn faster", TASKS), discovery=roomy)
    discover.advance(parsed, rec, tmp_path / "studies", tmp_path / "artifacts")
    assert [c.stage.kind for c in rec.claims] == ["confirm"]  # type: ignore[union-attr]


def test_a_campaign_whose_screen_flagged_nothing_still_draws_both_figures_with_their_data(tmp_path: Path) -> None:
    """The figures show why nothing was flagged: each screen effect's interval, each arm's objective."""
    d = Discovery(knobs=[Knob(key="lr", ladder=[1e-4, 1e-3, 1e-2]), Knob(key="kl_coef", ladder=[0.0, 0.1])],
                  defaults={"lr": 1e-3, "kl_coef": 0.0})
    rec = CampaignRecord(name="g", budget_s=3600.0, study_deadline=0.0, claims=[],
                         goal=goal.read("Make the letters task learn faster", TASKS), discovery=d)
    parsed = spec.parse('[campaign]\nname = "g"\ngoal = "Make the letters task learn faster"\n')
    discover.advance(parsed, rec, tmp_path / "studies", tmp_path / "artifacts")
    rec.claims[0].recorded, rec.claims[0].cpu_hours = True, 0.2
    d.record_screen([Effect(knob="lr", low=1e-4, high=1e-2, estimate=0.01, resolved=False, hw=0.12),
                     Effect(knob="kl_coef", low=0.0, high=0.1, estimate=-0.02, resolved=False, hw=0.11)],
                    {"{lr=0.0001}": 0.31, "{kl_coef=0.1, lr=0.01}": 0.35})
    assert d.converged == ("round 1's screen flagged no knob (its narrowest interval was ±0.110, against a minimum "
                           "effect of 0.02)")
    written = figures.write(rec, tmp_path / "figures")
    assert [p.name for p in written] == ["progress.png", "forest.png"]
    with (tmp_path / "figures" / "forest.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["changes"]) for r in rows] == [
        ("screen arm", "{lr=0.0001}"), ("screen arm", "{kl_coef=0.1, lr=0.01}"),
        ("screen", "lr: 0.0001 -> 0.01"), ("screen", "kl_coef: 0.0 -> 0.1")]
    assert float(rows[2]["low"]) == pytest.approx(-0.11) and float(rows[2]["high"]) == pytest.approx(0.13)
    assert float(rows[0]["tested"]) == pytest.approx(0.31) and rows[2]["held"] == "False"


def test_a_screen_the_budget_cut_is_not_read_and_ends_the_search_saying_so() -> None:
    """An arm short of its seeds would read as an absent effect: the campaign says the screen did not complete."""
    d = Discovery(knobs=[Knob(key="lr", ladder=[1e-4, 1e-3, 1e-2]), Knob(key="kl_coef", ladder=[0.0, 0.1])],
                  defaults={"lr": 1e-3, "kl_coef": 0.0})
    stage = d.next_stage()
    assert stage is not None and stage.kind == "screen"
    arms = [Arm(name=f"arm{i}", overrides=config, axes={"episode": Cell(mean=0.3, n=2)})
            for i, config in enumerate(stage.arms)]
    study = Evidence(knob="lr", metric="eval/reward_mean", axis="episode", arms=arms)
    assert discover._complete(study, stage, seeds=2)
    arms[-1].axes["episode"] = Cell(mean=0.3, n=1)  # its second run was cut
    assert not discover._complete(study, stage, seeds=2)
    assert not discover._complete(Evidence(knob="lr", metric="m", axis="episode", arms=arms[:-1]), stage, seeds=1)
    d.record_screen_cut("round 1's screen did not complete")
    assert d.converged == "round 1's screen did not complete" and d.next_stage() is None
    assert d.headline() == "Nothing beat the baseline: round 1's screen did not complete."
    assert d.stages_run == 1 and len(d.screens) == 1  # a verify stage would draw the next seed block


def test_a_single_configuration_runs_as_a_design_of_its_own() -> None:
    """A search baseline's one run (bench_discovery's greedy and random search) goes through the same study."""
    design = Design(task="letters", shape="runs", arms=[{"name": "run", "overrides": {"lr": 3e-3, "group_size": 4}}])  # type: ignore[list-item]
    text = topic_for(design)
    assert design.knob == "group_size" and text.startswith("Does group_size = 4 make the letters task learn fast?")
    question = topic.parse(text)
    plan = DesignedPlanner(design, OfflinePlanner(TASKS)).plan(DesignedPlanner(design, OfflinePlanner(TASKS)).frame(
        text, "").value, {"iteration": 1}).value
    assert [e.overrides for e in plan.experiments] == [{"lr": 3e-3, "group_size": 4}]
    assert topic.plan_complaint(question, design.knob, [e.overrides for e in plan.experiments]) is None
    with pytest.raises(ValueError, match="a comparison design needs at least two arms"):
        Design(task="letters", arms=[{"name": "run", "overrides": {"lr": 3e-3}}])  # type: ignore[list-item]
