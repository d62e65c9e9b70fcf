"""Each pool member's log-prob mismatch: the step-metric key a trainer reports it under, and the fold.

A trainer recomputes the log-probs of every sample it trains on and reports, per pool member that
sampled rows of the batch, the worst difference from what the member reported
(``<SOURCE_DIFF_PREFIX><member id>`` in the step's metrics). The pool reads those keys back
(``GeneratorPool.mismatch``) and drains a remote member beyond ``max_worker_logprob_diff``: one that
serves another model or a stale version is caught by arithmetic, not trust.

Standard library only: the trainers (torch, verl) and the pool's router (which never imports torch)
share it, and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SOURCE_DIFF_PREFIX", "worst_by_source"]

# A trainer reports the worst log-prob mismatch of each pool member's samples under this prefix
# (``<prefix><member id>``), so the server can drain a member that serves the wrong model.
SOURCE_DIFF_PREFIX = "pool/logprob_diff_max/"


def worst_by_source(worst: dict[str, float], sources: Sequence[str], row_max: Sequence[float]) -> None:
    """Fold each row's worst mismatch into ``worst`` under the pool member that sampled the row (rows
    without a known member, "", and any rows past ``sources`` are skipped)."""
    for source, value in zip(sources, row_max):
        if source:
            worst[source] = max(worst.get(source, 0.0), value)
