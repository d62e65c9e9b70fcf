"""The control API: actions, live config patches, supervised steps, events.
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from swarm.protocol._base import _Wire
from swarm.protocol.chat import ChatMessage
from swarm.protocol.status import ServerState

__all__ = ["ConfigPatch", "ConfigView", "ControlAction", "ControlResult", "Event", "SftExample", "SftRequest", "SftResult"]

class ControlAction(str, Enum):
    pause = "pause"
    resume = "resume"
    checkpoint = "checkpoint"
    stop = "stop"


class ControlResult(BaseModel):
    action: ControlAction
    state: ServerState
    detail: dict[str, Any] = Field(default_factory=dict)


class ConfigPatch(_Wire):
    """``PATCH /api/v1/config``: any subset of live settings; validated as a whole, then versioned."""

    values: dict[str, Any] = Field(min_length=1)


class ConfigView(BaseModel):
    version: int
    values: dict[str, Any]


class SftExample(_Wire):
    """A supervised warm-up example: the assistant's ``completion`` after ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    completion: str = Field(min_length=1)
    tools: list[dict[str, Any]] | None = Field(None, description="tools rendered by the chat template, as in chat")


class SftRequest(_Wire):
    """``POST /api/v1/control/sft``: a short supervised warm-up a study ships with its client."""

    examples: list[SftExample] = Field(min_length=1, max_length=4096)
    steps: int = Field(1, ge=1, le=10_000)
    batch_size: int = Field(16, ge=1, le=1024)
    lr: float | None = Field(None, gt=0, le=1.0)


class SftResult(BaseModel):
    steps: int
    loss_first: float
    loss_last: float
    policy_version: int


class Event(BaseModel):
    """One item of ``GET /api/v1/events`` (SSE ``id`` = ``id``, ``event`` = ``type``)."""

    id: int
    type: str
    time: float
    data: dict[str, Any] = Field(default_factory=dict)
