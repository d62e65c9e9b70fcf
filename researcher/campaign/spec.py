"""A campaign file (TOML): the campaign's name, the study options its claims share, and its claims.

    [campaign]
    name = "grpo-replications"
    steps_per_run = 20            # optional: any of STUDY_KEYS, for every claim's study
    question = "What makes the letters task learn faster?"   # optional: an open question (below)
    # or instead of claims and a question: goal = "Make the letters task learn faster per episode consumed"
    [[claim]]
    topic = "Does a KL coefficient of 0.1 slow learning on letters compared with 0?"
    expect = "yes"                # or "no", "no meaningful difference"
    source = "DAPO, arXiv 2503.14476"
    # optional: model, data, heldout, reward, prompt_key, answer_key, data_config, share, and any of STUDY_KEYS

An open ``question`` (with or without claims) is screened first: its first claim is a screen of the task's
knobs (``researcher.planner.screen``), and each knob the screen flags becomes a claim of its own, run on
seeds the screen never used (``CONFIRM_SEED_BASE``), so the selection's luck does not enter its verdict.

A ``goal`` makes the campaign write its own claims, round after round (``researcher.campaign.discovery``);
a goal campaign has no ``[[claim]]`` entries.

A broken file is refused whole (``ValueError`` naming the claim and the key), before anything is written.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from researcher.study.layout import check_study_id

# "screen": the campaign's own claim for its open question; "stage": a stage of a goal's discovery loop
# (``researcher.campaign.discovery``). Neither expects a verdict, and a file may use neither.
Expectation = Literal["yes", "no", "no meaningful difference", "screen", "stage"]
# Study options a campaign or one of its claims may set (``researcher start``'s flags of the same names).
STUDY_KEYS = ("steps_per_run", "seeds", "max_runs", "max_iterations", "min_effect", "parallel_runs", "seed_base")
CONFIRM_SEED_BASE = 100_000  # a confirmation's seeds: far from the screen's (seed_base 0: 1000 + k, 2000 + k, ...)


class StudyKnobs(BaseModel):
    """What sizes a claim's study; unset keys fall back to the campaign's, then to ``researcher start``'s."""

    model_config = ConfigDict(extra="forbid")

    steps_per_run: int | None = Field(None, ge=1)
    seeds: int | None = Field(None, ge=1, le=16)
    max_runs: int | None = Field(None, ge=1)
    max_iterations: int | None = Field(None, ge=1, le=50)
    min_effect: float | None = Field(None, ge=0)
    parallel_runs: int | None = Field(None, ge=1, le=16)
    seed_base: int | None = Field(None, ge=0, le=1_000_000)


class Claim(StudyKnobs):
    """One hypothesis: its question, what the source found, and what it runs on."""

    topic: str = Field(min_length=8)
    expect: Expectation
    source: str = ""
    model: str | None = None
    data: str | None = None
    heldout: str | None = None
    reward: str | None = None
    prompt_key: str | None = None
    answer_key: str | None = None
    data_config: str | None = Field(None, description="with data: the task's server config (``researcher start "
                                    "--data-config``); unset: the example one, scaled to ``model``")
    share: float | None = Field(None, gt=0, le=1, description="the most of the campaign's budget this claim may spend")
    design: dict[str, Any] | None = Field(None, description="a discovery stage's arms (``researcher start --design``)")
    alpha: float | None = Field(None, gt=0, lt=0.5, description="its study's two-sided false-positive rate")

    @field_validator("expect", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


class CampaignHeader(StudyKnobs):
    name: str
    question: str | None = Field(None, min_length=8, description="an open question, screened first")
    goal: str | None = Field(None, min_length=8, description="a goal the campaign pursues on its own, round after "
                             "round (``researcher.campaign.discovery``)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_study_id(value)


class CampaignSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    campaign: CampaignHeader
    claim: list[Claim] = Field(default_factory=list)

    @model_validator(mode="after")
    def _something_to_study(self) -> CampaignSpec:
        if self.campaign.goal and (self.claim or self.campaign.question):
            raise ValueError("a `goal` campaign writes its own claims: give no [[claim]] entries or `question` beside it")
        if not self.claim and not self.campaign.question and not self.campaign.goal:
            raise ValueError("a campaign needs [[claim]] entries, an open `question` or a `goal` in [campaign]")
        if any(c.expect in ("screen", "stage") for c in self.claim):
            raise ValueError("expect = \"screen\" or \"stage\" is the campaign's own; a claim expects "
                             "yes, no or no meaningful difference")
        return self

    def expanded(self, added: list[dict[str, object]]) -> CampaignSpec:
        """Every claim the campaign runs, in its order: the screen of its question (when it has one), the
        file's claims, then the confirmations the screen added (``added``, kept in campaign.json)."""
        screen = ([Claim(topic=self.campaign.question, expect="screen", source="the campaign's open question")]
                  if self.campaign.question else [])
        return self.model_copy(update={"claim": [*screen, *self.claim, *(Claim.model_validate(c) for c in added)]})

    def knobs(self, index: int) -> dict[str, object]:
        """Claim ``index``'s study options: its own, else the campaign's (unset ones are not given)."""
        claim = self.claim[index]
        return {k: getattr(claim, k) if getattr(claim, k) is not None else getattr(self.campaign, k)
                for k in STUDY_KEYS if getattr(claim, k) is not None or getattr(self.campaign, k) is not None}


def parse(text: str, where: str = "the campaign file") -> CampaignSpec:
    """The campaign in ``text``; ``ValueError`` with every problem, located, for a broken one."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where} is not TOML: {exc}") from None
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{where}: {problems}") from None
    shares = sum(c.share or 0 for c in spec.claim)
    if shares > 1 + 1e-9:
        raise ValueError(f"{where}: the claims' shares add up to {shares:g}, more than the whole budget (1)")
    return spec


def load(path: Path) -> tuple[CampaignSpec, str]:
    """The campaign file at ``path`` and its text (kept in the campaign folder as it was started)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the campaign file {path}: {exc}") from None
    return parse(text, str(path)), text
