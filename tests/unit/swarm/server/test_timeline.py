"""Timeline merging on hand-built token sequences (the server-level tests use the real model)."""

from __future__ import annotations

import pytest

from swarm.server.records.timeline import EpisodeTrace


def _call(trace: EpisodeTrace, prompt: list[int], completion: list[int], version: int = 0) -> None:
    trace.record(prompt, [(completion, [-0.5] * len(completion))], version=version, temperature=1.0)


def test_extending_calls_merge_into_one_sample_with_exact_masks() -> None:
    trace = EpisodeTrace(merge=True)
    _call(trace, [1, 2, 3], [10, 11])
    _call(trace, [1, 2, 3, 10, 11, 4, 5], [12], version=1)
    (sample,) = trace.samples(advantage=0.5)
    assert sample.tokens == [1, 2, 3, 10, 11, 4, 5, 12]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert sample.rollout_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]
    assert sample.policy_versions == [0, 1]
    assert trace.drift_forks == 0


def test_rewritten_history_forks_and_counts_drift() -> None:
    trace = EpisodeTrace(merge=True)
    _call(trace, [1, 2, 3], [10, 11])
    _call(trace, [1, 2, 9, 4], [12])  # history rewritten: not a continuation
    samples = trace.samples(advantage=1.0)
    assert [s.tokens for s in samples] == [[1, 2, 3, 10, 11], [1, 2, 9, 4, 12]]
    assert trace.drift_forks == 1


def test_unmerged_mode_keeps_one_sample_per_call_with_same_generated_tokens() -> None:
    merged, unmerged = EpisodeTrace(merge=True), EpisodeTrace(merge=False)
    for trace in (merged, unmerged):
        _call(trace, [1, 2], [10])
        _call(trace, [1, 2, 10, 3], [11, 12])
    assert len(merged.samples(0.0)) == 1 and len(unmerged.samples(0.0)) == 2
    generated = lambda samples: sorted(t for s in samples for t, m in zip(s.tokens, s.loss_mask) if m)  # noqa: E731
    assert generated(merged.samples(0.0)) == generated(unmerged.samples(0.0))
    assert unmerged.tokens > merged.tokens
    assert unmerged.drift_forks == merged.drift_forks == 0


def test_n_choices_are_sibling_branches_not_drift() -> None:
    trace = EpisodeTrace(merge=True)
    trace.record([1, 2], [([10], [-0.1]), ([20], [-0.2])], version=0, temperature=1.0)
    _call(trace, [1, 2, 20, 5], [30])
    tokens = sorted(s.tokens for s in trace.samples(0.0))
    assert tokens == [[1, 2, 10], [1, 2, 20, 5, 30]]
    assert trace.drift_forks == 0


def test_mismatched_logprobs_are_rejected() -> None:
    with pytest.raises(ValueError):
        EpisodeTrace().record([1], [([2, 3], [-0.1])], version=0, temperature=1.0)
