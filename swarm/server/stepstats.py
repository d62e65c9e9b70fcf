"""Per-step metrics of a training batch: reward statistics and context-tracking counters.

Pure functions over the batch, so the numbers a step reports are easy to test and to read:
``train/*`` describe the episodes, ``context/*`` what timeline merging did to the samples and
``episode/<key>`` averages the metrics clients posted with ``finish`` (over the episodes that sent
that key), so a study's own diagnostics sit beside the reward curve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from swarm.backends.base import TrainSample
from swarm.server.episodes import EpisodeRecord


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
    for key, value in update.items():
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            metrics[key] = float(value)
    return metrics
