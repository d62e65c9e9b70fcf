"""``researcher.evidence.heldout_noise``: one held-out round's sampling sd, read from the runs' metrics.jsonl
as the monitor writes it, set against min_effect/4, with the samples a round would need."""

from __future__ import annotations

from pathlib import Path

from researcher.evidence import heldout_noise
from researcher.runs import record as runs
from swarm.protocol.status import StepMetrics


def _run(folder: Path, rounds: dict[int, dict[str, float]]) -> Path:
    """A run whose server logged these held-out rounds (step -> eval metrics) between training steps."""
    folder.mkdir(parents=True)
    steps = [StepMetrics(step=s, policy_version=s, time=1000.0 + s, metrics={"train/episodes": 32.0, **rounds.get(s, {})})
             for s in range(0, 11)]
    runs.append_metrics(folder, steps)
    return folder


def test_rounds_played_twice_or_more_give_their_sd_and_once_give_none(tmp_path: Path) -> None:
    twice = _run(tmp_path / "a", {0: {"eval/reward_mean": 0.1, "eval/reward_mean_sd": 0.004, "eval/step": 0},
                                  5: {"eval/reward_mean": 0.3, "eval/reward_mean_sd": 0.012, "eval/step": 5}})
    once = _run(tmp_path / "b", {0: {"eval/reward_mean": 0.1, "eval/step": 0}})
    no_heldout = _run(tmp_path / "c", {})
    assert sorted(heldout_noise.measured([twice, once])) == [0.004, 0.012]
    assert heldout_noise.measured([once]) == []
    assert heldout_noise.measured([no_heldout]) is None  # no held-out rounds at all: nothing to say


def test_the_sentence_compares_the_median_with_a_quarter_of_min_effect_and_sizes_the_samples() -> None:
    # sd 0.008 at 2 samples against 0.005: (0.008 / 0.005)^2 x 2 = 5.12, so 6 samples a task.
    assert heldout_noise.samples_needed(0.008, 2, 0.005) == 6
    above = heldout_noise.describe([0.006, 0.008, 0.010], min_effect=0.02, samples=2)
    assert "sd 0.0080 (median of 3 rounds) at 2 samples a task: above min_effect/4 = 0.0050" in above
    assert "`--eval-samples 6`" in above
    assert "within min_effect/4 = 0.0050" in heldout_noise.describe([0.003], min_effect=0.02, samples=4)
    assert "2.6x the held-out samples" in heldout_noise.describe([0.008], min_effect=0.02, samples=None)
    assert "not measured: each task ran once a round" in heldout_noise.describe([], min_effect=0.02, samples=None)
