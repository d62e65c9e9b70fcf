"""Discovery's decisions (``researcher.campaign.discovery``) on a synthetic landscape with letters-like
noise: a few knobs with real main effects, one interaction, the rest null. Hundreds of simulated
campaigns run the loop's own decision code in seconds; each stage's study is simulated as paired runs.

Across them the share of campaigns that confirm a change that does not help (a false confirmation of
any kind: a null knob, a combination, the final verification) stays at or below 5%, the family-wise
error the campaign's error budget promises. The mean true gain is printed beside greedy single-seed hill
climbing's on the same number of runs, with greedy's rate of keeping changes that do not help."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from scipy import stats

from researcher.campaign.discovery import (
    MAX_PROPOSALS,
    SEED_STRIDE,
    Change,
    Comparison,
    Discovery,
    Effect,
    Knob,
    Proposal,
    Stage,
)
from researcher.campaign.error_budget import ErrorBudget, gamma

KNOBS = [Knob(key="lr", ladder=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2]),
         Knob(key="temperature", ladder=[0.5, 0.7, 1.0, 1.3]),
         Knob(key="kl_coef", ladder=[0.0, 0.01, 0.05, 0.2]),
         Knob(key="adv_estimator", ladder=["grpo", "rloo", "reinforce_plus_plus"]),
         Knob(key="policy_loss", ladder=["vanilla", "gspo", "cispo"])]
DEFAULTS = {"lr": 1e-3, "temperature": 1.0, "kl_coef": 0.0, "adv_estimator": "grpo", "policy_loss": "vanilla"}
# Real main effects (AUC, by ladder position): lr peaks one step up from the default, KL only hurts (the
# default is best), clipping by GSPO helps a little; temperature and the advantage estimator do nothing.
MAIN = {"lr": [-0.08, -0.03, 0.0, 0.04, -0.04], "kl_coef": [0.0, -0.01, -0.03, -0.08], "policy_loss": [0.0, 0.025, 0.0]}
SEED_SD, RUN_SD = 0.02, 0.015  # a seed's shared shift (task order, held-out set) and each run's own noise
SEEDS = {"screen": 4, "confirm": 6, "refine": 3, "combine": 6, "verify": 6}
RUNS = 260  # each strategy's budget, in runs


def truth(config: dict[str, Any]) -> float:
    value = 0.30
    for knob in KNOBS:
        value += MAIN.get(knob.key, [0.0] * len(knob.ladder))[knob.ladder.index(config[knob.key])]
    if config["lr"] == 3e-3 and config["policy_loss"] == "gspo":
        value -= 0.015  # the interaction: the two gains do not add up
    return value


def flat(config: dict[str, Any]) -> float:
    """A landscape where nothing matters."""
    return 0.30


@dataclass
class Simulated:
    """Each stage's study as paired runs on a seeded generator; counts runs and false confirmations (at the
    stage's level, and as a fixed 5% per test would have had them)."""

    rng: np.random.Generator
    truth: Callable[[dict[str, Any]], float] = truth
    flag_all: bool = False  # the worst selection: the screen flags every knob, upwards
    runs: int = 0
    false: list[str] = field(default_factory=list)
    false_at_5: list[str] = field(default_factory=list)

    def outcomes(self, stage: Stage) -> np.ndarray:
        """Runs of every arm on the stage's seeds: [arm, seed], sharing each seed's shift."""
        n = SEEDS[stage.kind]
        self.runs += n * len(stage.arms)
        shift = self.rng.normal(0, SEED_SD, n)
        return np.array([[self.truth(arm) + shift[s] + self.rng.normal(0, RUN_SD) for s in range(n)] for arm in stage.arms])

    def screen(self, d: Discovery, stage: Stage) -> list[Effect]:
        y = self.outcomes(stage)
        effects = []
        for key, (low, high) in d.screen_factors():
            at_high = np.array([arm[key] == high for arm in stage.arms])
            contrast = y[at_high].mean(axis=0) - y[~at_high].mean(axis=0)  # per seed
            se = contrast.std(ddof=1) / math.sqrt(len(contrast))
            resolved = abs(contrast.mean()) > stats.t.ppf(0.975, len(contrast) - 1) * se
            estimate = 0.05 if self.flag_all else float(contrast.mean())
            effects.append(Effect(knob=key, low=low, high=high, estimate=estimate, resolved=resolved or self.flag_all))
        return effects

    def compare(self, stage: Stage) -> Comparison:
        y = self.outcomes(stage)
        d = y[1] - y[0]
        assert stage.alpha is not None
        se = d.std(ddof=1) / math.sqrt(len(d))
        half = stats.t.ppf(1 - stage.alpha, len(d) - 1) * se
        outcome = Comparison(diff=float(d.mean()), low=float(d.mean() - half), high=float(d.mean() + half))
        if self.truth(stage.arms[1]) <= self.truth(stage.arms[0]):
            if outcome.low > 0:
                self.false.append(f"{stage.kind} {stage.arms[1]}")
            if d.mean() - stats.t.ppf(0.95, len(d) - 1) * se > 0:
                self.false_at_5.append(f"{stage.kind} {stage.arms[1]}")
        return outcome


def campaign(rng: np.random.Generator, sim: Simulated | None = None) -> tuple[Discovery, Simulated]:
    d, sim = Discovery(knobs=KNOBS, defaults=DEFAULTS), sim or Simulated(rng)
    seeds_used: set[int] = set()
    while (stage := d.next_stage()) is not None:
        cost = SEEDS[stage.kind] * len(stage.arms) + (0 if stage.kind == "verify" else 2 * SEEDS["verify"])
        if sim.runs + cost > RUNS:  # the verification's runs are kept back until the search ends
            if stage.kind == "verify" or d.converged:
                break
            d.stop("the budget ended")
            continue
        assert stage.seed_base not in seeds_used  # no stage reuses another's seeds
        seeds_used.add(stage.seed_base)
        if stage.kind == "screen":
            d.record_screen(sim.screen(d, stage))
        elif stage.kind == "refine":
            means = sim.outcomes(stage).mean(axis=1)
            d.record_refine(stage.arms[int(means.argmax())][stage.knob or ""])
        else:
            d.record_comparison(sim.compare(stage))
    return d, sim


def greedy(rng: np.random.Generator) -> tuple[dict[str, Any], int, int]:
    """autoresearch's loop: move one knob to a neighbouring level, one run, keep it if it beats the
    incumbent's one run. Returns the final configuration, changes kept, and kept changes that do not help."""
    incumbent = dict(DEFAULTS)
    score = truth(incumbent) + rng.normal(0, math.hypot(SEED_SD, RUN_SD))
    kept = bad = 0
    for _ in range(RUNS - 1):
        knob = KNOBS[rng.integers(len(KNOBS))]
        i = knob.ladder.index(incumbent[knob.key])
        j = i + (1 if i == 0 else -1 if i == len(knob.ladder) - 1 else int(rng.choice([-1, 1])))
        candidate = {**incumbent, knob.key: knob.ladder[j]}
        value = truth(candidate) + rng.normal(0, math.hypot(SEED_SD, RUN_SD))
        if value > score:
            kept += 1
            bad += truth(candidate) <= truth(incumbent)
            incumbent, score = candidate, value
    return incumbent, kept, bad


def test_hundreds_of_simulated_campaigns_keep_false_confirmations_at_or_below_5_percent() -> None:
    rng = np.random.default_rng(2026)
    n = 300
    results = [campaign(rng) for _ in range(n)]
    false_share = sum(1 for _, sim in results if sim.false) / n
    gains = [truth(d.incumbent) - truth(DEFAULTS) for d, _ in results]
    verified = [d.verified for d, _ in results if d.verified is not None]
    claimed = [v.diff for v in verified]
    greedy_runs = [greedy(rng) for _ in range(n)]
    greedy_gain = float(np.mean([truth(c) - truth(DEFAULTS) for c, _, _ in greedy_runs]))
    greedy_bad = sum(b for _, _, b in greedy_runs) / max(sum(k for _, k, _ in greedy_runs), 1)
    print(f"\nRESULT simulated campaigns={n} false_confirmation_share={false_share:.3f} "
          f"campaign_true_gain={np.mean(gains):+.4f} campaign_claimed={np.mean(claimed):+.4f} "
          f"greedy_true_gain={greedy_gain:+.4f} greedy_kept_not_helping={greedy_bad:.2f} "
          f"best_possible={max(gains):+.4f}")
    assert false_share <= 0.05
    assert np.mean(gains) > 0.02  # it finds the learning rate's gain, usually GSPO's too
    assert all(g >= -1e-9 for g, (d, _) in zip(gains, results, strict=True) if d.verified and d.verified.held)
    # No winner's curse: the verified estimate (fresh seeds) is unbiased for the true gain it claims.
    true_of_verified = [truth(d.incumbent) - truth(DEFAULTS) for d, _ in results if d.verified is not None]
    assert abs(np.mean(claimed) - np.mean(true_of_verified)) < 0.01


def test_the_error_budget_holds_where_every_screen_flags_every_null_knob() -> None:
    """The worst selection (every knob flagged, nothing real): a fixed 5% a test would confirm some null in
    about one campaign in five; the budget keeps it at or below one in twenty."""
    rng = np.random.default_rng(7)
    sims = [campaign(rng, Simulated(rng, truth=flat, flag_all=True))[1] for _ in range(400)]
    at_budget = sum(1 for s in sims if s.false) / len(sims)
    at_5 = sum(1 for s in sims if s.false_at_5) / len(sims)
    print(f"\nnull landscape, every knob flagged: false confirmations {at_budget:.3f} (a fixed 5% a test: {at_5:.3f})")
    assert at_budget <= 0.05 < at_5


def test_the_error_budget_spends_a_shrinking_share_and_passes_a_held_tests_level_on() -> None:
    budget = ErrorBudget()
    assert sum(gamma(j) for j in range(1, 10_000)) == pytest.approx(1.0, abs=1e-3)
    first = budget.next_level()
    assert first == pytest.approx(0.025)
    budget.record(first, rejected=False)
    assert budget.next_level() == pytest.approx(0.05 / 6)  # nothing carried
    budget.record(budget.next_level(), rejected=True)
    assert budget.next_level() == pytest.approx(0.05 / 12 + 0.05 / 6)  # the held test's level carries on
    with pytest.raises(ValueError, match="next level"):
        budget.record(0.05, rejected=True)


def test_a_round_that_flags_nothing_converges_and_nothing_beat_the_baseline() -> None:
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    stage = d.next_stage()
    assert stage is not None and stage.kind == "screen" and stage.seed_base == SEED_STRIDE
    assert len(stage.arms) == 8 and all(set(arm) == set(DEFAULTS) for arm in stage.arms)
    # The screen's levels bracket the incumbent: lr 3e-4 and 3e-3 around 1e-3; kl from its end, 0 and 0.01.
    assert dict(d.screen_factors())["lr"] == [3e-4, 3e-3] and dict(d.screen_factors())["kl_coef"] == [0.0, 0.01]
    d.record_screen([Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.05, resolved=False),
                     Effect(knob="kl_coef", low=0.0, high=0.01, estimate=-0.05, resolved=True)])  # its best is the incumbent
    assert d.next_stage() is None and "flagged no knob" in d.converged
    assert d.headline().startswith("Nothing beat the baseline: round 1's screen flagged no knob")


def test_a_confirmed_change_is_refined_combined_adopted_and_verified_on_fresh_seeds() -> None:
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    d.record_screen([Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.07, resolved=True),
                     Effect(knob="policy_loss", low="vanilla", high="gspo", estimate=0.03, resolved=True)])
    confirm = d.next_stage()
    assert confirm is not None and confirm.kind == "confirm" and confirm.arms[1]["lr"] == 3e-3
    assert confirm.alpha == pytest.approx(0.025)
    assert confirm.min_effect == pytest.approx(0.035)  # sized to half the +0.07 the screen saw
    d.record_comparison(Comparison(diff=0.04, low=0.02, high=0.06))  # lr 3e-3 holds
    second = d.next_stage()
    assert second is not None and second.arms[1]["policy_loss"] == "gspo"
    assert second.min_effect == pytest.approx(0.02)  # half of +0.03 is below the campaign's minimum
    assert second.alpha == pytest.approx(0.05 / 6 + 0.025)
    d.record_comparison(Comparison(diff=0.01, low=-0.01, high=0.03))  # GSPO does not
    refine = d.next_stage()
    assert refine is not None and refine.kind == "refine" and [a["lr"] for a in refine.arms] == [1e-3, 3e-3, 1e-2]
    d.record_refine(3e-3)
    combine = d.next_stage()
    assert combine is not None and combine.kind == "combine" and combine.arms[1] == {**DEFAULTS, "lr": 3e-3}
    assert combine.min_effect == pytest.approx(0.02)  # half the best confirmed +0.04
    d.record_comparison(Comparison(diff=-0.01, low=-0.03, high=0.01))  # the combination fails: the best single change
    assert d.incumbent == {**DEFAULTS, "lr": 3e-3} and d.round == 2 and d.next_stage().kind == "screen"  # type: ignore[union-attr]
    d.stop("the budget ended")
    verify = d.next_stage()
    assert verify is not None and verify.kind == "verify" and verify.arms == [DEFAULTS, {**DEFAULTS, "lr": 3e-3}]
    assert verify.min_effect is None  # the headline resolves the campaign's own minimum
    bases = [s.seed_base for s in (confirm, second, refine, combine, verify)]
    assert len(set(bases)) == len(bases)
    d.record_comparison(Comparison(diff=0.035, low=0.01, high=0.06))
    assert d.next_stage() is None
    assert d.headline() == ("Best configuration so far: {lr=0.003}: confirmed gain +0.035 (confidence bounds +0.010 "
                            f"to +0.060 at level {d.verified.alpha:.4f}) over the baseline, on seeds never used to "  # type: ignore[union-attr]
                            "select it.")
    with pytest.raises(ValueError, match="no comparison"):
        d.record_comparison(Comparison(diff=0.0, low=0.0, high=0.0))
    assert [c.knob for c in d.tests[0].changes] == ["lr"] and isinstance(d.tests[0].changes[0], Change)


def test_proposals_beyond_the_catalog_are_confirmed_after_the_screens_flags_and_refined() -> None:
    """An LLM's hypotheses join a round without changing its screen, go through the same confirmation after the
    screen's own flags (spending the same error budget), and a confirmed new key is refined like any knob."""
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    screen = d.next_stage()
    taken = d.propose([Proposal(knob="lr", value=2e-3, why="between the ladder's levels"),
                       Proposal(knob="lr", value=5e-3),  # a second level of a knob already proposed
                       Proposal(knob="kl_coef", value=0.01),  # a level the screen tests anyway
                       Proposal(knob="temperature", value=1.0),  # the incumbent's
                       Proposal(knob="top_p", value=0.9, current=1.0, why="a key the catalog does not screen"),
                       Proposal(knob="entropy_coef", value=0.001, current=0.0),
                       Proposal(knob="max_tokens", value=24, current=16)])
    assert [(p.knob, p.value) for p in taken] == [("lr", 2e-3), ("top_p", 0.9), ("entropy_coef", 0.001)]
    assert len(taken) == MAX_PROPOSALS and d.next_stage() == screen  # the screen's arms are unchanged
    d.record_screen([Effect(knob="policy_loss", low="vanilla", high="gspo", estimate=0.03, resolved=True),
                     Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.01, resolved=False)])
    assert [(c.knob, c.value) for c in d.flagged] == [("policy_loss", "gspo"), ("lr", 2e-3), ("top_p", 0.9),
                                                      ("entropy_coef", 0.001)]
    assert d._knob("lr").ladder == [1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 1e-2]  # refined around its new level
    alphas = []
    for held in (False, True, True, False):  # gspo fails; lr 2e-3 and top_p 0.9 hold; entropy does not
        stage = d.next_stage()
        assert stage is not None and stage.kind == "confirm" and stage.alpha is not None
        alphas.append(stage.alpha)
        d.record_comparison(Comparison(diff=0.03 if held else 0.0, low=0.01 if held else -0.02, high=0.05))
    assert d.budget.levels == alphas and d.budget.rejected == [False, True, True, False]  # one budget for all
    refine = d.next_stage()
    assert refine is not None and refine.kind == "refine" and [a["lr"] for a in refine.arms] == [1e-3, 2e-3, 3e-3]
    d.record_refine(2e-3)
    refine = d.next_stage()
    assert refine is not None and refine.knob == "top_p" and {a["top_p"] for a in refine.arms} == {0.9, 1.0}
    d.record_refine(0.9)
    combine = d.next_stage()
    assert combine is not None and combine.arms[1] == {**DEFAULTS, "lr": 2e-3, "top_p": 0.9}
    with pytest.raises(ValueError, match="before its screen"):
        d.propose([Proposal(knob="lr", value=5e-3)])


def test_a_confirmed_proposal_for_an_unset_key_skips_the_refine_it_has_no_levels_for() -> None:
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    assert [p.knob for p in d.propose([Proposal(knob="top_k", value=20, why="unset: the server's default")])] == ["top_k"]
    d.record_screen([])  # the screen flagged nothing: the proposal alone is confirmed
    confirm = d.next_stage()
    assert confirm is not None and confirm.arms == [DEFAULTS, {**DEFAULTS, "top_k": 20}]
    d.record_comparison(Comparison(diff=0.03, low=0.01, high=0.05))
    combine = d.next_stage()
    assert combine is not None and combine.kind == "combine" and combine.arms[1] == {**DEFAULTS, "top_k": 20}


def test_a_budget_that_ends_after_a_confirmation_keeps_the_confirmed_change() -> None:
    """Cut before its refine, a round still adopts what it confirmed; in round 1 that confirmation compared
    the baseline itself with the change on fresh seeds, so it is the verified headline."""
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    d.record_screen([Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.07, resolved=True)])
    d.record_comparison(Comparison(diff=0.022, low=0.013, high=0.031))
    assert d.next_stage().kind == "refine"  # type: ignore[union-attr]
    d.stop("the budget ended the search")
    assert d.incumbent == {**DEFAULTS, "lr": 3e-3} and d.next_stage() is None
    assert d.headline().startswith("Best configuration so far: {lr=0.003}: confirmed gain +0.022")
    later = Discovery(knobs=KNOBS, defaults=DEFAULTS, incumbent={**DEFAULTS, "lr": 3e-3}, round=2)
    later.record_screen([Effect(knob="kl_coef", low=0.0, high=0.01, estimate=0.05, resolved=True)])
    later.record_comparison(Comparison(diff=0.03, low=0.01, high=0.05))
    later.stop("the budget ended the search")
    verify = later.next_stage()  # round 2's confirmation was against round 1's incumbent: verify on fresh seeds
    assert verify is not None and verify.kind == "verify" and verify.arms[1] == {**DEFAULTS, "lr": 3e-3, "kl_coef": 0.01}


def test_flags_tested_together_become_the_incumbent_if_they_hold_and_end_the_search_if_not() -> None:
    """A round the budget cannot fit confirms its flags as one combination: one test, one level of the budget."""
    d = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    d.record_screen([Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.08, resolved=True),
                     Effect(knob="policy_loss", low="vanilla", high="gspo", estimate=0.04, resolved=True)])
    d.confirm_together()
    stage = d.next_stage()
    assert stage is not None and stage.kind == "combine" and stage.alpha == pytest.approx(0.025)
    assert stage.arms == [DEFAULTS, {**DEFAULTS, "lr": 3e-3, "policy_loss": "gspo"}]
    assert stage.min_effect == pytest.approx(0.04)  # half the largest effect the screen saw
    d.record_comparison(Comparison(diff=0.09, low=0.05, high=0.13))
    assert d.incumbent == {**DEFAULTS, "lr": 3e-3, "policy_loss": "gspo"} and d.round == 2 and not d.together
    d.record_screen([Effect(knob="kl_coef", low=0.0, high=0.01, estimate=0.05, resolved=True),
                     Effect(knob="temperature", low=0.7, high=1.3, estimate=0.03, resolved=True)])
    d.confirm_together()
    d.record_comparison(Comparison(diff=0.01, low=-0.02, high=0.04))
    assert d.incumbent == {**DEFAULTS, "lr": 3e-3, "policy_loss": "gspo"}
    assert d.converged == "round 2's flags, tested together for want of budget, did not hold"
    assert [t.kind for t in d.tests] == ["combine", "combine"] and d.next_stage().kind == "verify"  # type: ignore[union-attr]
    later = Discovery(knobs=KNOBS, defaults=DEFAULTS)
    later.record_screen([Effect(knob="lr", low=3e-4, high=3e-3, estimate=0.08, resolved=True),
                         Effect(knob="policy_loss", low="vanilla", high="gspo", estimate=0.04, resolved=True)])
    later.record_comparison(Comparison(diff=0.05, low=0.02, high=0.08))
    with pytest.raises(ValueError, match="before any one of them"):
        later.confirm_together()
