"""The offline planner maps topics onto tasks and knobs, and refuses the ones it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from researcher.cli import app
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from researcher.planner.schema import TopicNotMappable

EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"
TASKS = ["calculator", "digits", "letters"]


@pytest.mark.parametrize(("topic", "knob", "task"), [
    ("Does a larger GRPO group size make the letters task learn faster?", "group_size", "letters"),
    ("What learning rate is best for digit reversal?", "lr", "digits"),
    ("Does sampling temperature matter?", "temperature", "letters"),
    ("Is a KL penalty needed?", "kl_coef", "letters"),
    ("Does timeline merging speed up multi-turn tool use?", "merge_timelines", "calculator"),
    ("Which advantage estimator works best: grpo or rloo?", "adv_estimator", "letters"),
    ("Does the GSPO policy loss beat vanilla clipping?", "policy_loss", "letters"),
    ("How much policy lag can async training on the calculator tolerate?", "max_staleness", "calculator"),
    ("Does importance correction of stale samples help?", "rollout_is", "letters"),
    ("Does vLLM rollout change learning?", "engine", "letters"),
    ("Does training on verl's FSDP2 workers change learning on digits?", "trainer", "digits"),
])
def test_topics_map_onto_knob_and_task(topic: str, knob: str, task: str) -> None:
    framing = OfflinePlanner(TASKS).frame(topic, "catalog").value
    assert (framing.knob, framing.task, framing.answerable) == (knob, task, True)


def test_unmappable_topic_lists_what_it_can_study() -> None:
    with pytest.raises(TopicNotMappable) as info:
        OfflinePlanner(TASKS).frame("Is the moon made of cheese?", catalog.describe(EXAMPLES))
    message = str(info.value)
    for item in catalog.KNOBS:
        assert f"`{item.key}`" in message
    assert "letters" in message


def test_first_plan_is_a_controlled_comparison_and_refinement_walks_the_ladder() -> None:
    planner = OfflinePlanner(TASKS)
    framing = planner.frame("larger group size on letters?", "").value
    first = planner.plan(framing, {"iteration": 1}).value
    assert [e.overrides for e in first.experiments] == [{"group_size": 2}, {"group_size": 8}]
    # Registered before running on what the verdict judges: the held-out reward, per episode for a group size.
    assert first.hypotheses[0].metric == "eval/reward_mean"
    assert "held-out `eval/reward_mean` curve per episode consumed" in first.hypotheses[0].expected_effect
    second = planner.plan(framing, {"iteration": 2, "best_value": 8, "tested_values": [2, 8]}).value
    assert [e.overrides for e in second.experiments] == [{"group_size": 8}, {"group_size": 16}]
    third = planner.plan(framing, {"iteration": 2, "best_value": 2, "tested_values": [2, 8]}).value
    assert [e.overrides for e in third.experiments] == [{"group_size": 2}, {"group_size": 4}]
    done = planner.decide(framing, {"last": {"best_value": 16, "plateau": None},
                                    "tested_values": [2, 8, 16]}).value
    assert done.action == "conclude"
    plateau = planner.decide(framing, {"last": {"best_value": 8, "plateau": "no gain"}, "tested_values": [2, 8]}).value
    assert plateau.action == "conclude" and plateau.reason == "no gain"


@pytest.mark.parametrize("topic", ["Does a group size of 8 beat 2 on letters?",
                                   "Does a larger GRPO group size make the letters task learn faster?"])
@pytest.mark.parametrize(("diff", "hw", "action", "stage"), [
    (0.004, 0.01, "conclude", None),        # no meaningful difference: settled
    (0.012, 0.010, "continue", "replicate"),  # below the minimum of interest, CI past it: more seeds, never "best"
    (0.015, 0.03, "continue", "replicate"),   # inconclusive
    (0.104, 0.05, "conclude", None),        # yes: the comparison answers the topic (named arms or not), no refining
])
def test_decisions_follow_the_verdict_rules(topic: str, diff: float, hw: float, action: str, stage: str | None) -> None:
    planner = OfflinePlanner(TASKS)
    framing = planner.frame(topic, "").value
    comparison = {"better": "it1-group-size-8", "worse": "it1-group-size-2", "diff": diff, "hw": hw,
                  "clear": diff - hw > 0}
    last = {"iteration": 1, "best": "it1-group-size-8", "best_value": 8, "comparison": comparison,
            "values": {"it1-group-size-8": 8, "it1-group-size-2": 2}}
    decision = planner.decide(framing, {"topic": topic, "last": last, "tested_values": [8, 2],
                                        "min_effect": 0.02}).value
    assert decision.action == action, decision.reason
    if stage:
        plan = planner.plan(framing, {"topic": topic, "iteration": 2, "history": [last], "min_effect": 0.02,
                                      "best_value": 8, "tested_values": [8, 2]}).value
        assert plan.stage == stage and sorted(e.overrides["group_size"] for e in plan.experiments) == [2, 8]


def test_the_pilot_decides_nothing_and_its_pair_runs_again_at_the_next_look() -> None:
    planner = OfflinePlanner(TASKS)
    topic = "Does a larger GRPO group size make the letters task learn faster?"
    framing = planner.frame(topic, "").value
    # A large pilot difference with no decision interval (the pilot spends no alpha): never a conclusion.
    comparison = {"better": "it1-group-size-2", "worse": "it1-group-size-8", "diff": 0.45, "hw": None, "hw95": 0.07,
                  "look": 1, "fraction": None, "seeds": 3}
    last = {"iteration": 1, "best": "it1-group-size-2", "best_value": 2, "comparison": comparison,
            "values": {"it1-group-size-8": 8, "it1-group-size-2": 2}}
    decision = planner.decide(framing, {"topic": topic, "last": last, "tested_values": [8, 2],
                                        "min_effect": 0.02}).value
    assert decision.action == "continue" and decision.reason.startswith(
        "the pilot (it1-group-size-2 − it1-group-size-8 = +0.450 over 3 seeds) decides nothing: it sizes the study")
    plan = planner.plan(framing, {"topic": topic, "iteration": 2, "history": [last], "min_effect": 0.02,
                                  "best_value": 2, "tested_values": [8, 2]}).value
    assert plan.stage == "replicate" and sorted(e.overrides["group_size"] for e in plan.experiments) == [2, 8]


def test_cli_refuses_unmappable_topic_and_writes_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["start", "--topic", "Is the moon made of cheese?", "--studies-dir",
                                      str(tmp_path / "studies"), "--artifacts-dir", str(tmp_path / "artifacts")],
                                env={"RESEARCHER_LLM_BASE_URL": "", "RESEARCHER_LLM_MODEL": ""})
    assert result.exit_code == 2
    assert "cannot map this topic" in result.output and "group_size" in result.output
    assert not (tmp_path / "studies").exists() and not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("args", [["--budget", "ten minutes"], ["--until", "2001-01-01T00:00"],
                                  ["--budget", "5m", "--until", "2099-01-01T00:00"], ["--study-id", "Bad/Id"]])
def test_cli_rejects_bad_options_without_writing(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(app, ["start", "--topic", "group size on letters", "--studies-dir",
                                      str(tmp_path / "s"), "--artifacts-dir", str(tmp_path / "a"), *args],
                                env={"RESEARCHER_LLM_BASE_URL": "", "RESEARCHER_LLM_MODEL": ""})
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "s").exists() and not (tmp_path / "a").exists()


def test_a_sweep_between_two_neighbouring_values_fills_in_midpoints() -> None:
    """Two ladder neighbours leave fewer than MIN_SWEEP points: midpoints fill the widest gaps until
    none is new (a local named like the ``mid`` helper once made this raise UnboundLocalError)."""
    from researcher.planner import catalog, ladder

    knob = catalog.KNOBS[0]
    points = ladder.spread(knob, knob.ladder[0], knob.ladder[1])
    assert len(points) > 2 and points == sorted(points)
    assert points[0] == knob.ladder[0] and points[-1] == knob.ladder[1]
