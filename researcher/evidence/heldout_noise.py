"""One held-out round's sampling noise with the weights fixed, set against the smallest effect that matters.

A held-out round scores the policy on a fixed set of problems, but its replies are sampled: replay the
same weights and the round's mean moves. That movement is not in any interval between seeds' curves
unless it is small. A run whose client plays each held-out task two or more times a round (``swarm run
--eval-samples``, the study's ``eval_samples``) has its server log ``eval/reward_mean_sd``: the round
mean's sd from the pooled within-task variance. The report quotes its median over the study's rounds
against ``min_effect / 4`` (a round's own noise a quarter of the smallest difference that matters) and
says how many samples a round would take to get there: the sd falls as one over the root of the samples.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from researcher.evidence.analysis import read_axes
from researcher.findings.axes import EVAL_METRIC

SD_METRIC = "eval/reward_mean_sd"
SHARE_OF_MIN_EFFECT = 0.25  # a round's own noise at most this share of min_effect


def measured(run_dirs: Iterable[Path]) -> list[float] | None:
    """Every held-out round's ``eval/reward_mean_sd`` in these runs (empty where each task ran once a
    round); None where no run played a held-out round at all."""
    dirs = list(run_dirs)
    if not any(read_axes(run_dir, EVAL_METRIC).values for run_dir in dirs):
        return None
    return [v for run_dir in dirs for v in read_axes(run_dir, SD_METRIC).values if math.isfinite(v)]


def samples_needed(sd: float, samples: int, target: float) -> int:
    """Samples a round that brings an sd of ``sd`` (measured at ``samples``) to ``target`` or below."""
    return max(1, math.ceil(samples * (sd / target) ** 2)) if target > 0 else samples


def describe(sds: list[float], min_effect: float, samples: int | None) -> str:
    """One sentence for the report's Discussion."""
    target = SHARE_OF_MIN_EFFECT * min_effect
    if not sds:
        return ("One held-out round's sampling noise was not measured: each task ran once a round. "
                "`--eval-samples 2` or more measures it (`eval/reward_mean_sd`).")
    sd = statistics.median(sds)
    said = f"One held-out round's sampling noise, with the weights fixed, was sd {sd:.4f} (median of {len(sds)} rounds)"
    if sd <= target:
        return f"{said}: within min_effect/4 = {target:.4f}."
    if samples is None:
        return (f"{said}: above min_effect/4 = {target:.4f}. About {(sd / target) ** 2:.1f}x the held-out "
                "samples a round would bring it there (`--eval-samples`).")
    return (f"{said} at {samples} samples a task: above min_effect/4 = {target:.4f}. "
            f"`--eval-samples {samples_needed(sd, samples, target)}` would bring it there.")
