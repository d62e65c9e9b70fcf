"""Discovery: a campaign that writes its own claims, round by round, around an incumbent configuration.

A goal fixes a task and an objective (an AUC on an axis). The incumbent starts as the task's defaults.
A round is a sequence of stages, each an ordinary study:

1. **screen** the knobs at two levels around the incumbent's values (a two-level factorial); it flags
   the knobs whose main effect is resolved and beyond the minimum effect;
2. **confirm** each flagged knob, strongest first: its better level against the incumbent;
3. **refine** each confirmed knob: a dose-response over at least 3 levels around its confirmed level;
   the best becomes its level;
4. **combine**: the incumbent with every refined change, against the incumbent. If it holds, it is the
   new incumbent; if not, the best single confirmed change is.

A round whose budget cannot fit steps 2 to 4 tests its flags together instead: one combination against the
incumbent (``confirm_together``), adopted if it holds.

An LLM, where one is configured, may add a few hypotheses to a round before its screen runs (``propose``):
a level outside a knob's ladder, or a config key the catalog does not screen. They are not screened: they
join the screen's flags, after them, and go through the same confirmation on fresh seeds.

The next round screens around the new incumbent. The search converges when a screen flags nothing (or
nothing it flags holds); it ends when the budget does. A last **verify** stage compares the final
incumbent with the defaults; its estimate is the campaign's headline.

Three rules keep it honest:
- every stage draws seeds no stage before it used (``seed_base``), so seeds that selected a change never
  confirm it;
- confirmations (confirm, combine, verify) share one ``ErrorBudget``: at most a 5% chance of any false
  confirmation over the whole campaign;
- the headline gain is the verify stage's, measured on fresh seeds, never the best score seen in search.

Pure: ``next_stage`` says what to run and ``record`` folds its outcome in. The campaign runner maps a
stage to a study; the simulated test maps it to a synthetic landscape, so the same decisions run both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from researcher.campaign.error_budget import ErrorBudget
from researcher.campaign.levels import (
    Config,
    Knob,
    describe,
    ordered,
    refine_levels,
    screen_arms,
    screen_pair,
)

__all__ = ["Change", "Comparison", "Config", "Discovery", "Effect", "Knob", "Proposal", "Screened", "Stage", "Test"]

StageKind = Literal["screen", "confirm", "refine", "combine", "verify"]
SEED_STRIDE = 10_000  # stage k's studies add this x (k + 1) to their seeds (a study spans 1000 an iteration, at most 9)
MAX_PROPOSALS = 3  # hypotheses beyond the catalog a round takes
# A confirmation is sized to resolve this share of the effect that selected it (the screen's estimate, biased
# up by the selection), not the campaign's minimum: a change the screen saw at +0.1 needs a few seeds to hold,
# not the dozen that would resolve ±0.02. A change that holds at less than this share is still kept: sizing
# decides only how many seeds a confirmation starts with, never its test.
SIZE_TO_SEEN = 0.5


class Change(BaseModel):
    """Set ``knob`` to ``value``; ``seen``: the effect the screen that flagged it estimated (None: not screened)."""

    knob: str
    value: Any
    seen: float | None = None


class Proposal(Change):
    """A hypothesis beyond the catalog (an LLM's): set ``knob`` from its ``current`` value (the incumbent's or
    the task's; None: unset, the server's default) to ``value``, and why."""

    current: Any = None
    why: str = ""


class Stage(BaseModel):
    """What to run next. ``arms[0]`` is the control (the incumbent, or the defaults for verify) in a
    comparison; ``alpha`` is the one-sided level a confirmation is tested at (None: no test, a selection);
    ``min_effect`` the difference its study is sized to resolve (None: the campaign's own)."""

    round: int
    kind: StageKind
    arms: list[Config]
    seed_base: int
    knob: str | None = None
    alpha: float | None = None
    min_effect: float | None = None


class Effect(BaseModel):
    """A screen's main effect of a knob: the mean at ``high`` minus the mean at ``low``, and whether it is
    resolved (its 95% interval excludes 0)."""

    knob: str
    low: Any
    high: Any
    estimate: float
    resolved: bool
    hw: float | None = None  # its 95% interval's half-width (None: the screen gave none)


class Screened(BaseModel):
    """A screen as run: its main effects, and each arm's objective (its mean AUC) by configuration."""

    round: int
    effects: list[Effect]
    arms: dict[str, float] = Field(default_factory=dict)


class Comparison(BaseModel):
    """A comparison's outcome: treatment minus control, its confidence bounds at the stage's level, and the
    two arms' objective (their mean AUC) where the study measured them."""

    diff: float
    low: float
    high: float
    control: float | None = None
    treatment: float | None = None


class Test(Comparison):
    """A confirmation as run: what it changed, at which level, and what it found."""

    round: int
    kind: StageKind
    changes: list[Change]
    alpha: float
    held: bool


class Discovery(BaseModel):
    """A discovery campaign's search state (kept in campaign.json)."""

    knobs: list[Knob]
    defaults: Config
    incumbent: Config = Field(default_factory=dict)
    min_effect: float = 0.02
    round: int = 1
    step: StageKind = "screen"
    stages_run: int = 0
    flagged: list[Change] = Field(default_factory=list)  # this round's, strongest first, still to confirm
    confirmed: list[Test] = Field(default_factory=list)  # this round's confirmations that held
    refining: list[Change] = Field(default_factory=list)  # confirmed changes still to refine
    refined: list[Change] = Field(default_factory=list)
    proposals: list[Proposal] = Field(default_factory=list)  # this round's beyond the catalog, confirmed after the flags
    extra_knobs: list[Knob] = Field(default_factory=list)  # keys proposals brought in: refined, never screened
    proposals_asked: int = 0  # the last round whose proposals were asked for (an LLM is asked once a round)
    tests: list[Test] = Field(default_factory=list)
    screens: list[Screened] = Field(default_factory=list)
    steps: int | None = None  # every stage's run length (steps at the largest batch), fixed before the first
    together: bool = False  # this round's flags go to one combination, unconfirmed one by one (``confirm_together``)
    budget: ErrorBudget = Field(default_factory=ErrorBudget)
    converged: str = ""
    verified: Test | None = None

    def model_post_init(self, _context: Any) -> None:
        if not self.incumbent:
            self.incumbent = dict(self.defaults)

    # ----------------------------------------------------------------- what to run

    def next_stage(self) -> Stage | None:
        """The stage to run next; None once the search has converged and the incumbent is verified."""
        seed_base = SEED_STRIDE * (self.stages_run + 1)
        if self.converged:
            if self.verified is not None or self.incumbent == self.defaults:
                return None
            return Stage(round=self.round, kind="verify", arms=[dict(self.defaults), dict(self.incumbent)],
                         seed_base=seed_base, alpha=self.budget.next_level())
        if self.step == "screen":
            return Stage(round=self.round, kind="screen", seed_base=seed_base,
                         arms=[{**self.incumbent, **arm} for arm in screen_arms(self.screen_factors())])
        if self.step == "confirm":
            change = self.flagged[0]
            return Stage(round=self.round, kind="confirm", knob=change.knob, seed_base=seed_base,
                         arms=[dict(self.incumbent), self._with([change])], alpha=self.budget.next_level(),
                         min_effect=self._sized_to(change.seen))
        if self.step == "refine":
            change = self.refining[0]
            levels = refine_levels(self._knob(change.knob), change.value, self.incumbent.get(change.knob))
            return Stage(round=self.round, kind="refine", knob=change.knob, seed_base=seed_base,
                         arms=[self._with([Change(knob=change.knob, value=v)]) for v in levels])
        return Stage(round=self.round, kind="combine", seed_base=seed_base, alpha=self.budget.next_level(),
                     arms=[dict(self.incumbent), self._with(self.refined)],
                     min_effect=self._sized_to(max([t.diff for t in self.confirmed]
                                                   + [c.seen for c in self.refined if self.together and c.seen],
                                                   default=None)))

    def screen_factors(self) -> list[tuple[str, list[Any]]]:
        """Each knob with its two screen levels around the incumbent's value (``screen_pair``)."""
        return [(k.key, screen_pair(k, self.incumbent.get(k.key))) for k in self.knobs]

    # ----------------------------------------------------------------- outcomes

    def record_screen_cut(self, why: str) -> None:
        """The screen ended before every arm had its runs (the budget cut it, or runs failed): it is not read,
        since a fraction of a design it did not complete would mistake missing arms for absent effects. The
        search ends, keeping the incumbent."""
        self._ran("screen")
        self.screens.append(Screened(round=self.round, effects=[]))
        self.stop(why)

    def propose(self, proposals: Sequence[Proposal]) -> list[Proposal]:
        """Take up to ``MAX_PROPOSALS`` hypotheses beyond the catalog into this round, before its screen is
        recorded (a key the search does not know becomes a knob of its own, never screened). Returns those
        taken: one that repeats the incumbent, a knob already proposed, or a level the screen tests is left
        out. The screen's arms do not change."""
        if self.converged or self.step != "screen":
            raise ValueError(f"proposals join a round before its screen; the campaign expects {self.next_stage()}")
        screened = dict(self.screen_factors())
        for p in proposals:
            if (len(self.proposals) >= MAX_PROPOSALS or p.value == self.incumbent.get(p.knob, p.current)
                    or any(q.knob == p.knob for q in self.proposals) or p.value in screened.get(p.knob, [])):
                continue
            if self._find(p.knob) is None:  # an unset key's default is the server's: its ladder is the new level
                self.extra_knobs.append(Knob(key=p.knob, ladder=ordered([v for v in (p.current, p.value) if v is not None])))
            self.proposals.append(p)
        return list(self.proposals)

    def record_screen(self, effects: Sequence[Effect], arms: dict[str, float] | None = None) -> None:
        """The screen's main effects (and its arms' objectives, by configuration, for the figures): the knobs
        to confirm, strongest first, at their better level; then the round's proposals, on knobs the screen
        did not flag."""
        self._ran("screen")
        self.screens.append(Screened(round=self.round, effects=list(effects), arms=arms or {}))
        flagged = sorted((e for e in effects if e.resolved and abs(e.estimate) > self.min_effect),
                         key=lambda e: -abs(e.estimate))
        self.flagged = [Change(knob=e.knob, value=e.high if e.estimate > 0 else e.low, seen=abs(e.estimate))
                        for e in flagged]
        self.flagged = [c for c in self.flagged if c.value != self.incumbent.get(c.knob)]
        for p in self.proposals:  # after the screen's own flags: confirmed like them, refined on the knob's ladder
            if all(c.knob != p.knob for c in self.flagged):
                knob = self._knob(p.knob)
                knob.ladder = knob.ladder if p.value in knob.ladder else ordered([*knob.ladder, p.value])
                self.flagged.append(Change(knob=p.knob, value=p.value))
        self.proposals = []
        if not self.flagged:
            widths = [e.hw for e in effects if e.hw is not None]
            # A screen too small to see effects near the minimum converges as well; the ledger says how small.
            seen = f" (its narrowest interval was ±{min(widths):.3f}, against a minimum effect of {self.min_effect})" \
                if widths and min(widths) > self.min_effect else ""
            self.converged = f"round {self.round}'s screen flagged no knob{seen}"
            return
        self.step = "confirm"

    def record_comparison(self, outcome: Comparison) -> None:
        """A confirm, combine or verify stage's comparison (treatment − control) at its stage's level."""
        stage = self.next_stage()
        if stage is None or stage.alpha is None:
            raise ValueError("no comparison is expected now")
        held = outcome.low > 0
        self.budget.record(stage.alpha, held)
        changes = [Change(knob=k, value=v) for k, v in stage.arms[1].items() if stage.arms[0].get(k) != v]
        test = Test(round=self.round, kind=stage.kind, changes=changes, alpha=stage.alpha, held=held,
                    **outcome.model_dump())
        self.tests.append(test)
        self.stages_run += 1
        if stage.kind == "verify":
            self.verified = test
        elif stage.kind == "confirm":
            self.flagged.pop(0)
            if held:
                self.confirmed.append(test)
                change = test.changes[0]  # a knob with one known level has nothing to refine around
                (self.refining if len(self._knob(change.knob).ladder) > 1 else self.refined).append(change)
            if not self.flagged:
                self._after_confirmations()
        else:
            self._adopt(test)

    def confirm_together(self) -> None:
        """The round cannot fit a confirmation of each flag, their refinement and their combination: test the
        flags together, as one combination against the incumbent (one confirmation, in the same error budget).
        If it holds it is the new incumbent, a claim about the configuration, not about each of its parts;
        if not, the search ends, as when nothing a screen flagged holds."""
        if self.step != "confirm" or self.confirmed or self.converged:
            raise ValueError(f"flags are confirmed together before any one of them; the campaign expects {self.next_stage()}")
        self.refined, self.flagged, self.together = list(self.flagged), [], True
        self.step = "combine"

    def record_refine(self, best: Any) -> None:
        """The dose-response's best level of the knob being refined (a selection: no test)."""
        self._ran("refine")
        change = self.refining.pop(0)
        self.refined.append(Change(knob=change.knob, value=best))
        if not self.refining:
            self.step = "combine"

    def stop(self, why: str) -> None:
        """The budget ended the search (the verify stage may still run, if it fits). Changes this round
        confirmed are not dropped: the best one becomes the incumbent, as when a combination fails. Where the
        incumbent was still the defaults, its confirmation compared exactly the baseline and this change, on
        seeds nothing selected with: it is the verification."""
        if not self.converged and self.confirmed:
            best = max(self.confirmed, key=lambda t: t.diff)
            from_defaults = self.incumbent == self.defaults
            self.incumbent = self._with(best.changes)
            self.verified = best if from_defaults else None
            self.flagged, self.confirmed, self.refining, self.refined, self.together = [], [], [], [], False
        self.converged = self.converged or why

    # ----------------------------------------------------------------- the headline

    def headline(self) -> str:
        """The ledger's line: the verified gain over the defaults on seeds never used to select it."""
        v = self.verified
        if self.incumbent == self.defaults:
            if not self.converged:
                return f"Searching (round {self.round}, {self.step}): nothing has beaten the baseline yet."
            return f"Nothing beat the baseline: {self.converged}."
        shown = describe(self.incumbent, self.defaults).strip("{}")
        if v is None:
            return f"Best configuration so far: {{{shown}}}: not yet verified against the baseline on fresh seeds."
        word = "confirmed gain" if v.held else "gain not confirmed"
        return (f"Best configuration so far: {{{shown}}}: {word} {v.diff:+.3f} (confidence bounds {v.low:+.3f} to "
                f"{v.high:+.3f} at level {v.alpha:.4f}) over the baseline, on seeds never used to select it.")

    # ----------------------------------------------------------------- inside

    def _ran(self, kind: StageKind) -> None:
        if self.converged or self.step != kind:
            raise ValueError(f"a {kind} result arrived while the campaign expects {self.next_stage()}")
        self.stages_run += 1

    def _after_confirmations(self) -> None:
        if not self.confirmed:
            self._next_round(f"nothing round {self.round}'s screen flagged held on fresh seeds")
        else:
            self.step = "refine" if self.refining else "combine"

    def _adopt(self, combine: Test) -> None:
        """The combination holds: it is the incumbent. Else the best single confirmed change is (flags tested
        together had none: the search ends)."""
        if combine.held:
            self.incumbent = self._with(self.refined)
        elif self.together:
            self._next_round(f"round {self.round}'s flags, tested together for want of budget, did not hold")
            return
        else:
            best = max(self.confirmed, key=lambda t: t.diff)
            self.incumbent = self._with(best.changes)
        self._next_round("")

    def _next_round(self, converged: str) -> None:
        self.flagged, self.confirmed, self.refining, self.refined, self.together = [], [], [], [], False
        self.converged = converged
        if not converged:
            self.round += 1
            self.step = "screen"

    def _sized_to(self, seen: float | None) -> float | None:
        """The difference a comparison's study is sized to resolve, given the effect that selected it."""
        return None if seen is None else max(self.min_effect, SIZE_TO_SEEN * seen)

    def _with(self, changes: Sequence[Change]) -> Config:
        return {**self.incumbent, **{c.knob: c.value for c in changes}}

    def _knob(self, key: str) -> Knob:
        knob = self._find(key)
        if knob is None:
            raise KeyError(f"no knob {key!r} in the search")
        return knob

    def _find(self, key: str) -> Knob | None:
        return next((k for k in [*self.knobs, *self.extra_knobs] if k.key == key), None)
