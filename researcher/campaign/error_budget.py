"""One error budget for every confirmation a discovery campaign makes: the online fallback procedure.

A campaign that runs round after round tests as many changes as it has budget for. Testing each at 5%
would make a false discovery near-certain over a long campaign. Its confirmations (each flagged knob
against the incumbent, each round's combination against the incumbent, the final verification) are
tested in the order they run, each at its own level:

    alpha_j = alpha * gamma_j + (alpha_{j-1} if test j-1 rejected, else 0)

with ``gamma_j = 1 / (j (j + 1))``, which sums to 1. This is the online fallback procedure (Tian and
Ramdas, "Online control of the familywise error rate", 2021): the chance of even one false confirmation
over the whole campaign, however many rounds it runs, is at most ``alpha``, under any dependence between
the tests. That is the family-wise error rate, stronger than a false discovery rate.

Why this and not alpha-investing or e-values with e-BH: alpha-investing controls only the marginal FDR,
and e-BH needs every e-value before it decides, while a campaign must decide each confirmation as it
ends (the next round starts from what held). The fallback rule decides online, and it passes a rejected
test's level on, so a campaign that keeps finding real improvements keeps its power; one that finds
nothing spends ever smaller levels, which is the price of looking again.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

ALPHA = 0.05


def gamma(j: int) -> float:
    """The share of ``alpha`` test ``j`` (1-based) gets of its own: 1/2, 1/6, 1/12, ... (sums to 1)."""
    if j < 1:
        raise ValueError(f"tests are numbered from 1, not {j}")
    return 1.0 / (j * (j + 1))


class ErrorBudget(BaseModel):
    """The levels spent so far and which tests rejected (kept in the campaign's record)."""

    alpha: float = Field(ALPHA, gt=0, lt=1)
    levels: list[float] = Field(default_factory=list)
    rejected: list[bool] = Field(default_factory=list)

    def next_level(self) -> float:
        """The level of the next confirmation: its own share, plus the last one's level if that one held."""
        j = len(self.rejected) + 1
        carried = self.levels[-1] if self.rejected and self.rejected[-1] else 0.0
        return self.alpha * gamma(j) + carried

    def record(self, level: float, rejected: bool) -> None:
        """A confirmation ended at ``level`` (the one ``next_level`` gave it) and rejected its null or not."""
        if abs(level - self.next_level()) > 1e-12:
            raise ValueError(f"a confirmation ran at {level:g}, but the budget's next level is {self.next_level():g}")
        self.levels.append(level)
        self.rejected.append(rejected)
