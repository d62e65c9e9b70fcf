"""Which claim gets the campaign's next session: the open one closest to settling.

A claim never looked at comes first (in file order): its pilot is what tells how far it is from
settling. After that, the fewest seeds an arm still missing (its pilot's sizing ``needed_seeds`` less
the seeds it has) goes first: the next batch of seeds is most likely to settle it. A claim whose
sizing is unknown ranks after every sized one; ties go to the claim that has spent least. A claim
that has spent its ``share`` of the budget, or whose study ended (settled, at its last registered look,
or out of runs), gets nothing more. The sequential rules stay the study's own: the campaign only
chooses which study takes its next registered look, never how a look decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from researcher.campaign.record import ClaimRecord


def missing_seeds(claim: ClaimRecord) -> float:
    """Seeds an arm the claim's study still needs by its pilot's sizing (inf when unknown)."""
    if not claim.looks:
        return -1.0  # no pilot yet: first
    last = claim.looks[-1]
    if last.needed_seeds is None:
        return math.inf
    return max(last.needed_seeds - last.seeds, 0)


def next_claim(claims: Sequence[ClaimRecord], shares: Sequence[float | None], budget_s: float) -> ClaimRecord | None:
    """The claim to run next, or None when every claim is closed or out of its share."""
    open_ = [c for c in claims if not c.closed and c.spent_s < (shares[c.index] or 1.0) * budget_s]
    if not open_:
        return None
    return min(open_, key=lambda c: (missing_seeds(c), c.spent_s, c.index))
