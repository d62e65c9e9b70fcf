"""The DAPO and Dr. GRPO claims reach the knobs they are about and the metrics they are judged on.

A claim is not always about the reward: clip-higher is said to keep entropy from collapsing, Dr. GRPO
to stop long wrong answers from growing. The catalog names each knob's metric; the offline planner
frames the topic onto the knob, words the question with that metric and registers it in the
hypotheses, so the verdict (``analysis.choose_metric``) is judged on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from researcher.evidence import analysis
from researcher.findings.axes import EVAL_METRIC
from researcher.planner import catalog, topic
from researcher.planner.offline import OfflinePlanner
from researcher.study import files as studyfiles
from researcher.types.design import same_value

EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"
TASKS = sorted(catalog.examples(EXAMPLES))
CLIP_TOPIC = "Does clip-higher (clip_ratio_high 0.28 vs 0.2) keep entropy higher on letters?"


def _frame_and_plan(text: str) -> tuple[Any, Any]:
    planner = OfflinePlanner(TASKS)
    framing = planner.frame(text, catalog.describe(EXAMPLES)).value
    task_config = studyfiles.server_config(catalog.examples(EXAMPLES)[framing.task].config, {})
    plan = planner.plan(framing, {"iteration": 1, "topic": text, "task_config": task_config,
                                  "min_effect": 0.02}).value
    return framing, plan


def test_clip_higher_is_framed_onto_its_knob_and_judged_on_entropy() -> None:
    framing, plan = _frame_and_plan(CLIP_TOPIC)
    assert (framing.knob, framing.task, framing.metric) == ("clip_ratio_high", "letters", "train/entropy")
    assert "`train/entropy` curve" in framing.question
    assert "keeps the letters task's `train/entropy` higher" in framing.question  # a height, not "learn faster"
    assert "learn faster" not in framing.question
    assert [e.overrides for e in plan.experiments] == [{"clip_ratio_high": 0.28}, {"clip_ratio_high": 0.2}]
    assert {h.metric for h in plan.hypotheses} == {"train/entropy"}
    assert "train/entropy" in plan.hypotheses[0].expected_effect
    # The verdict is judged on the registered metric, not switched to the reward.
    metric, why = analysis.choose_metric("train/entropy", [])
    assert metric == "train/entropy" and "the metric the plan judges" in why


@pytest.mark.parametrize(("text", "knob", "values", "metric"), [
    (CLIP_TOPIC, "clip_ratio_high", [0.28, 0.2], "train/entropy"),
    ("Does DAPO's dynamic sampling help on digits?", "batch_mode", ["varied_groups", "groups"], EVAL_METRIC),
    ("Does Dr. GRPO shorten wrong answers compared with GRPO on letters?", "recipe", ["dr_grpo", "none"],
     "train/response_length_neg_mean"),
    ("Does a KL coefficient of 0.05 beat 0.2 on digits?", "kl_coef", [0.05, 0.2], EVAL_METRIC),
])
def test_each_claim_runs_its_arms_on_its_metric(text: str, knob: str, values: list[Any], metric: str) -> None:
    framing, plan = _frame_and_plan(text)
    assert framing.knob == knob
    ran = [e.overrides[knob] for e in plan.experiments]
    assert len(ran) == len(values) and all(any(same_value(r, v) for r in ran) for v in values), ran
    assert {h.metric for h in plan.hypotheses} == {metric}
    assert framing.metric == (catalog.REWARD_METRIC if metric == EVAL_METRIC else metric)
    assert topic.plan_complaint(topic.parse(text), knob, [e.overrides for e in plan.experiments]) is None


def test_the_catalog_tells_the_llm_planner_which_metric_a_knob_is_judged_on() -> None:
    text = catalog.describe(EXAMPLES)
    assert "`clip_ratio_high`" in text and "judged on `train/entropy`" in text
    assert "judged on `train/response_length_neg_mean`" in text
    assert catalog.knob("kl_coef").metric == catalog.REWARD_METRIC
    for key in ("clip_ratio_high", "clip_ratio_low", "recipe", "batch_mode"):
        assert key in catalog.CONFIG_KEYS
