"""Episodes: claims, the episode handed to a client, finishing and aborting it.
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from swarm.protocol._base import _Wire

__all__ = ["EPISODE_TRANSITIONS", "RUN_NAME", "AbortRequest", "ClaimRequest", "Episode", "EpisodeState", "EpisodeStatus",
           "FinishRequest", "Purpose", "RunKey", "RunKeyRequest"]

class EpisodeState(str, Enum):
    claimed = "claimed"
    finished = "finished"
    aborted = "aborted"
    expired = "expired"


# Valid lifecycle transitions; everything else is a user error (409/410).
EPISODE_TRANSITIONS: dict[EpisodeState, frozenset[EpisodeState]] = {
    EpisodeState.claimed: frozenset({EpisodeState.finished, EpisodeState.aborted, EpisodeState.expired}),
    EpisodeState.finished: frozenset(),
    EpisodeState.aborted: frozenset(),
    EpisodeState.expired: frozenset(),
}


Purpose = Literal["train", "eval"]


class ClaimRequest(_Wire):
    """``POST /api/v1/episodes``: claim one episode of a task's GRPO group, or (``purpose="eval"``)
    one held-out evaluation episode: served like any other, never recorded, grouped or trained; its
    reward goes to the ``eval/*`` metrics of the step whose policy it evaluated."""

    task_id: str = Field(min_length=1, max_length=256)
    group_id: str | None = Field(None, max_length=256, description="GRPO group; defaults to task_id")
    group_size: int | None = Field(None, ge=1, le=1024, description="expected group size; server default if unset")
    category: str | None = Field(None, max_length=64, description="task category for mixing ratios")
    client_id: str = Field("anonymous", max_length=128)
    lease_s: float | None = Field(None, gt=0, le=3600)
    request_id: str | None = Field(None, max_length=128, description="makes the claim idempotent")
    purpose: Purpose = Field("train", description="train (the default) or eval: a held-out evaluation episode")
    eval_every: int | None = Field(None, ge=1, le=1_000_000, description="eval claims: the client evaluates every "
                                   "this many steps; the server then holds each such step's successor for its round")

    @model_validator(mode="after")
    def _eval_ungrouped(self) -> ClaimRequest:
        if self.purpose == "eval" and (self.group_id is not None or self.group_size is not None):
            raise ValueError("an eval episode is never grouped: send no group_id or group_size with purpose=eval")
        if self.purpose != "eval" and self.eval_every is not None:
            raise ValueError("eval_every goes with purpose=eval only")
        return self


class Episode(BaseModel):
    episode_id: str
    base_url: str
    api_key: str
    policy_version: int
    lease_expires_at: float
    task_id: str
    group_id: str
    category: str | None = None
    purpose: Purpose = "train"
    step: int = Field(0, description="the server's training step when claimed (an eval evaluates its policy)")


RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # a run's name: no dots, so its key parses


class RunKeyRequest(_Wire):
    """``POST /api/v1/runs``: one key for a whole run (``swarm.server.episodes.runs``: an episode per conversation)."""

    run: str = Field(pattern=RUN_NAME, description="the run's name: letters, digits, _ and -, at most 64")


class RunKey(BaseModel):
    run: str
    base_url: str
    api_key: str


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number (no NaN or infinity)")
    return value


class FinishRequest(_Wire):
    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _reward_finite(cls, value: float) -> float:
        return _finite(value)

    @field_validator("metrics")
    @classmethod
    def _metrics_finite(cls, value: dict[str, float]) -> dict[str, float]:
        for key, number in value.items():
            if not math.isfinite(number):
                raise ValueError(f"metric {key!r} must be finite")
        return value


class AbortRequest(_Wire):
    reason: str = Field("aborted by client", max_length=2000)


class EpisodeStatus(BaseModel):
    episode_id: str
    state: EpisodeState
    lease_expires_at: float | None = None
    reward: float | None = None
