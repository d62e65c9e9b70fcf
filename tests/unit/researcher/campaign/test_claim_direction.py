"""A claim's verdict answers the claim's own question. Its study signs the difference larger minus smaller
(better minus worse for a named knob), so a claim that asks whether its first-named value *lowers* the
metric, names the smaller value first, or asks whether two settings match, gets the study's resolved
direction turned: "Does a KL coefficient of 0.2 slow learning?" is a Yes when the study's Answer is "No: the
larger kl_coef learned slower". (The first replication campaign scored exactly that claim as a disagreement
before this rule.)"""

from __future__ import annotations

import pytest

from researcher.campaign.standing import as_claimed
from researcher.findings.records import Arm, Comparison, Evidence
from researcher.findings.verdicts import Verdict
from researcher.planner.topic import parse


def _study(knob: str, better: tuple[str, object], worse: tuple[str, object]) -> Evidence:
    arms = [Arm(name=name, value=value) for name, value in (better, worse)]
    return Evidence(knob=knob, metric="eval/reward_mean", arms=arms,
                    comparison=Comparison(better=better[0], worse=worse[0], diff=0.026, hw=0.018))


@pytest.mark.parametrize(("topic", "asks"), [
    ("Does a KL coefficient of 0.2 slow learning on letters compared with 0?", "lower"),
    ("Does Dr. GRPO keep wrong answers shorter than GRPO?", "lower"),
    ("Does a random reward of 0.5 slow learning compared with 0?", "lower"),
    ("Does a learning rate of 3e-3 beat 3e-5 on letters?", "higher"),
    ("Does clip-higher (clip_ratio_high 0.28 vs 0.2) keep entropy higher on letters?", "higher"),
    ("Does a group size of 2 match a group size of 8 per episode on letters?", "same"),
    ("Does setting batch_mode to varied_groups change how fast letters learns?", "different"),
    # an adjective naming the subject before the knob is not the effect asked about
    ("Does a lower learning rate of 1e-4 beat 1e-3 on letters?", "higher"),
])
def test_the_topic_says_what_it_asks_of_its_first_value(topic: str, asks: str) -> None:
    assert parse(topic).asks == asks


def test_a_claim_asking_whether_its_value_slows_learning_turns_the_studys_no_into_yes() -> None:
    kl = _study("kl_coef", ("kl_coef=0.0", 0.0), ("kl_coef=0.2", 0.2))  # KL 0 ahead: "No: the larger learned slower"
    topic = "Does a KL coefficient of 0.2 slow learning on letters compared with 0?"
    assert as_claimed(topic, Verdict.NO, kl) is Verdict.YES
    assert as_claimed("Does a KL coefficient of 0.2 beat 0 on letters?", Verdict.NO, kl) is Verdict.NO
    assert as_claimed("Does a KL coefficient of 0 beat 0.2 on letters?", Verdict.NO, kl) is Verdict.YES


def test_a_named_knob_is_answered_about_the_value_the_claim_names() -> None:
    # a named knob's study always says Yes when resolved ("Yes: groups (vs varied_groups) learned faster")
    sampling = _study("batch_mode", ("batch_mode=groups", "groups"), ("batch_mode=varied_groups", "varied_groups"))
    topic = "Does DAPO dynamic sampling (varied groups) make letters learn faster per training step?"
    assert as_claimed(topic, Verdict.YES, sampling) is Verdict.NO


def test_a_resolved_difference_answers_a_match_no_and_a_change_yes() -> None:
    groups = _study("group_size", ("group_size=2", 2), ("group_size=8", 8))  # "No: the larger learned slower"
    assert as_claimed("Does a group size of 2 match a group size of 8 on letters?", Verdict.NO, groups) is Verdict.NO
    assert as_claimed("Does a group size of 8 change how fast letters learns compared with 2?", Verdict.NO,
                      groups) is Verdict.YES


@pytest.mark.parametrize("verdict", [Verdict.NO_DIFFERENCE, Verdict.INCONCLUSIVE, Verdict.BELOW_MINIMUM, None])
def test_verdicts_without_a_direction_answer_either_question_alike(verdict: Verdict | None) -> None:
    kl = _study("kl_coef", ("kl_coef=0.0", 0.0), ("kl_coef=0.2", 0.2))
    assert as_claimed("Does a KL coefficient of 0.2 slow learning on letters compared with 0?", verdict, kl) is verdict


def test_an_a_a_check_keeps_its_verdict() -> None:
    same = _study("lr", ("aa-a", 0.003), ("aa-b", 0.003))
    topic = "A/A check: do two identical configurations of letters learn at different speeds?"
    assert as_claimed(topic, Verdict.YES, same) is Verdict.YES  # a false positive stays one
