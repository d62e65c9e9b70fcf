"""The spurious-rewards control (``random_reward``): a coin flip per episode, drawn from its id, so a
retried step trains on the same rewards; off, the posted rewards pass through."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from swarm.server.records.episode import Place
from swarm.server.training.step import coin, training_rewards


def _episodes(n: int, reward: float) -> list[Any]:
    return [SimpleNamespace(episode_id=f"ep-{i}", reward=reward, place=Place()) for i in range(n)]


def test_the_coin_pays_one_with_its_probability_and_the_same_for_an_id_every_time() -> None:
    flips = [coin(f"ep-{i}", 0.5) for i in range(4000)]
    assert set(flips) == {0.0, 1.0} and 0.46 < sum(flips) / len(flips) < 0.54
    assert flips == [coin(f"ep-{i}", 0.5) for i in range(4000)]
    rare = [coin(f"ep-{i}", 0.1) for i in range(4000)]
    assert 0.08 < sum(rare) / len(rare) < 0.12
    assert all(r <= f for r, f in zip(rare, flips, strict=True))  # one draw per id, compared with p


def test_off_the_posted_rewards_train_and_on_they_do_not() -> None:
    episodes = _episodes(64, 0.7)
    assert training_rewards(episodes, 0.0) == [0.7] * 64
    flipped = training_rewards(episodes, 0.5)
    assert set(flipped) == {0.0, 1.0} and flipped == [coin(e.episode_id, 0.5) for e in episodes]
