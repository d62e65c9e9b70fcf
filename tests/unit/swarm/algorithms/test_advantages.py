"""``swarm.algorithms.compute_advantages``: verl's outcome estimators by name, one advantage an episode,
groups kept apart; what it cannot compute is refused before verl is asked."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from swarm import algorithms


@dataclass(frozen=True)
class Settings:
    adv_estimator: str
    norm_adv_by_std: bool = True


REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5]
GROUPS = ["a", "a", "a", "a", "b", "b"]


def test_grpo_centres_each_group_on_its_own_mean_and_scales_by_its_spread() -> None:
    centred = algorithms.compute_advantages(REWARDS, GROUPS, Settings("grpo", norm_adv_by_std=False))
    assert centred == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    scaled = algorithms.compute_advantages(REWARDS, GROUPS, Settings("grpo"))
    spread = (1 / 3) ** 0.5  # group a's sample standard deviation; group b has none (all equal): 0 stays 0
    assert scaled == pytest.approx([0.5 / spread, -0.5 / spread, -0.5 / spread, 0.5 / spread, 0.0, 0.0], rel=1e-4)


def test_rloo_compares_each_episode_with_the_mean_of_the_others_in_its_group() -> None:
    advantages = algorithms.compute_advantages(REWARDS, GROUPS, Settings("rloo"))
    assert advantages == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0.0, 0.0])


def test_what_cannot_be_computed_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="got 2 rewards but 1 group ids"):
        algorithms.compute_advantages([1.0, 0.0], ["a"], Settings("grpo"))
    with pytest.raises(ValueError, match="rewards must be finite"):
        algorithms.compute_advantages([float("nan")], ["a"], Settings("grpo"))
    with pytest.raises(ValueError, match=r"unknown or unsupported adv_estimator 'gae'; known: \['grpo'"):
        algorithms.compute_advantages([1.0], ["a"], Settings("gae"))  # GAE needs a critic
    assert algorithms.compute_advantages([], [], Settings("rloo")) == []
