"""Per-step metrics of a training batch: reward statistics and context-tracking counters.

Pure functions over the batch, so the numbers a step reports are easy to test and to read:
``train/*`` describe the episodes, ``context/*`` what timeline merging did to the samples and
``episode/<key>`` averages the metrics clients posted with ``finish`` (over the episodes that sent
that key), so a study's own diagnostics sit beside the reward curve.

Some claims are judged on more than the reward: ``train/response_length_mean`` and
``train/response_length_neg_mean`` (generated tokens per sample, over all samples and over those with
a negative advantage: Dr. GRPO's length bias shows as long wrong answers) are counted here, the same
for every trainer; ``train/clip_fraction`` names the trainer's ``train/pg_clipfrac`` (kept too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarm.backends.base import TrainSample
from swarm.server.records.episode import EpisodeRecord


def step_metrics(episodes: Sequence[EpisodeRecord], groups: int, samples: Sequence[TrainSample],
                 update: dict[str, float], *, merge: bool) -> dict[str, float]:
    """Slash-keyed metrics of one step; the backend's own ``update`` metrics are included as-is."""
    rewards = [float(e.reward or 0.0) for e in episodes]
    n = len(rewards)
    mean = sum(rewards) / n if n else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else 0.0
    metrics: dict[str, float] = {
        "train/reward_mean": mean,
        "train/reward_std": std,
        "train/reward_max": max(rewards) if rewards else 0.0,
        "train/episodes": float(n),
        "train/groups": float(groups),
        "context/samples_per_episode": len(samples) / n if n else 0.0,
        "context/tokens_trained": float(sum(len(s.tokens) for s in samples)),
        "context/generated_tokens": float(sum(sum(s.loss_mask) for s in samples)),
        "context/drift_forks": float(sum(e.trace.drift_forks for e in episodes)),
        "context/drift_repaired": float(sum(e.trace.drift_repaired for e in episodes)),
        "rollout/tool_calls": float(sum(e.trace.tool_calls for e in episodes)),
        "rollout/tool_parse_errors": float(sum(e.trace.tool_parse_errors for e in episodes)),
        "rollout/tool_calls_extra": float(sum(e.trace.tool_calls_extra for e in episodes)),
        "context/merge": 1.0 if merge else 0.0,
    }
    posted: dict[str, list[float]] = {}
    for episode in episodes:
        for key, value in (episode.finish.metrics if episode.finish is not None else {}).items():
            posted.setdefault(key, []).append(value)
    for key, values in posted.items():
        metrics[f"episode/{key}"] = sum(values) / len(values)
    metrics.update(response_lengths(samples))
    for key, value in update.items():
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            metrics[key] = float(value)
    if "train/pg_clipfrac" in metrics:  # the name the catalog and the docs use, for every trainer
        metrics["train/clip_fraction"] = metrics["train/pg_clipfrac"]
    return metrics


def response_lengths(samples: Sequence[TrainSample]) -> dict[str, float]:
    """Mean generated tokens (``loss_mask`` ones) per sample, and over the negative-advantage samples
    alone (absent when the batch has none: a 0 would read as "short")."""
    lengths = [(sum(s.loss_mask), s.advantage) for s in samples]
    metrics = {"train/response_length_mean": sum(n for n, _ in lengths) / len(lengths) if lengths else 0.0}
    negative = [n for n, advantage in lengths if advantage < 0]
    if negative:
        metrics["train/response_length_neg_mean"] = sum(negative) / len(negative)
    return metrics
