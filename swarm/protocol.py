"""The wire contract: every model that crosses a process boundary, shared by server and client.

The server validates requests with these models, the client parses responses with them, and the
researcher logs them. Depends on pydantic only. Field names follow OpenAI's chat API (and vLLM's
``prompt_token_ids`` / ``token_ids`` extras) so any OpenAI SDK works unchanged.

Why one module a little over 400 lines: the whole wire contract reads in one place, as
``agentlightning/schemas.py`` does (one typed wire contract imported by both ends); splitting it would make every
reader of the contract hunt across files for one request's shape.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

API_PREFIX = "/api/v1"
MAX_BODY_BYTES = 4 * 1024 * 1024


def refused(message: str) -> PydanticCustomError:
    """A request option this server will not serve: raised in a validator, answered 400 naming the field."""
    return PydanticCustomError("refused", message)


class _Wire(BaseModel):
    """Requests reject unknown fields so typos fail loudly instead of being ignored."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- errors


class ErrorCode(str, Enum):
    bad_request = "bad_request"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    not_found = "not_found"
    conflict = "conflict"
    gone = "gone"
    payload_too_large = "payload_too_large"
    context_length_exceeded = "context_length_exceeded"
    retry_later = "retry_later"
    internal = "internal"


class ErrorInfo(BaseModel):
    code: ErrorCode
    message: str
    detail: Any = None
    retry_after: float | None = None


class ErrorBody(BaseModel):
    """The one error shape of every route: ``{"error": {"code", "message", "detail"}}``."""

    error: ErrorInfo


# --------------------------------------------------------------------------- chat (OpenAI)


class ChatMessage(BaseModel):
    """A chat message as OpenAI clients send it; extra keys (name, tool_call_id, …) are kept."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]  # OpenAI's values
# Fields OpenAI defines that change nothing about what is sampled: accepted and passed over.
PASS_THROUGH_FIELDS = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key")


class ChatCompletionRequest(_Wire):
    """``POST /v1/chat/completions``: OpenAI's fields plus vLLM's sampling extensions.

    Every field either works or is refused: an unknown field is a 400 naming it (as OpenAI answers),
    except the documented pass-through ones (``PASS_THROUGH_FIELDS``), which cannot change a sample.
    A silently ignored option would make a rollout differ from the experiment that asked for it.
    """

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    n: int = Field(1, ge=1, le=64)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=4.0, description="server default if unset")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 65, description="int64; choice i uses seed + i")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="alternatives per token (engines that report them)")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = Field(None, description='only {"type": "text"}')
    # vLLM's sampling extensions (vLLM's names and meanings).
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: off")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra variables for the chat template")
    logit_bias: dict[int, float] | None = Field(None, max_length=1024, description="token id -> bias in [-100, 100]")
    reasoning_effort: ReasoningEffort | None = Field(None, description="passed to the chat template (vLLM's kwarg)")
    add_generation_prompt: bool = Field(True, description="vLLM: end the prompt with the assistant's header")
    continue_final_message: bool = Field(False, description="vLLM: continue the final assistant message's text")
    # Pass-through (PASS_THROUGH_FIELDS).
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is not None and any(not -100.0 <= bias <= 100.0 for bias in value.values()):
            raise ValueError("each bias must lie in [-100, 100]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.stream_options is not None and not self.stream:
            raise refused("stream_options: only allowed with stream=true (as OpenAI answers)")
        if self.top_logprobs and not self.logprobs:
            raise refused("top_logprobs: only allowed with logprobs=true (as OpenAI answers)")
        if self.continue_final_message and (self.add_generation_prompt or self.messages[-1].role != "assistant"):
            raise refused("continue_final_message: needs add_generation_prompt=false and an assistant message last")
        for i, message in enumerate(self.messages):
            for k, part in enumerate(message.content if isinstance(message.content, list) else ()):
                if part.get("type") != "text":
                    raise refused(f"messages[{i}].content[{k}]: content parts of type {part.get('type')!r} are not "
                                  "served (this server's model reads text only): send text parts")
        return self

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError('only {"type": "text"} is served: structured output would constrain sampling, '
                             "and the policy's own samples are what trains")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_served(cls, value: ToolChoice | None) -> ToolChoice | None:
        if isinstance(value, dict) or value == "required":
            raise refused(
                "tool_choice 'required' and a named function need guided decoding (vLLM forces the call's "
                "JSON that way); the swarm does not constrain sampling, because the policy's own samples are "
                "what it trains on: send 'auto' (or leave it out) and reward the calls you want")
        return value


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="a JSON object, serialised")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_content: str | None = Field(None, description="the reasoning parser's split (vLLM's name)")


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] = Field(default_factory=list, description="generated ids (vLLM's name)")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    prompt_token_ids: list[int] = Field(default_factory=list)
    policy_version: int
    episode_id: str | None = Field(None, description="the episode this call was recorded into (also the "
                                   "x-swarm-episode header); none for a call with the control token")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "swarm"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --------------------------------------------------------------------------- episodes


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
    """``POST /api/v1/runs``: one key for a whole run (``swarm.server.runs``: an episode per conversation)."""

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


# --------------------------------------------------------------------------- status and metrics


class EpisodeCounts(BaseModel):
    """Training episodes. ``dropped_stale``: of ``dropped``, those older than ``max_staleness`` at their
    step; ``refused_stale``: claims and first chat calls answered 429 because they could not have
    finished within ``max_staleness`` (``swarm.server.admission``; since the process started, a retry
    refused again counts again)."""

    claimed: int = 0
    finished: int = 0
    aborted: int = 0
    expired: int = 0
    trained: int = 0
    dropped: int = 0
    dropped_stale: int = 0
    refused_stale: int = 0


class RecentCounts(BaseModel):
    """``EpisodeCounts`` over the last ``window_s`` seconds (``swarm status`` judges the drop rate by them)."""

    window_s: float = 60.0
    finished: int = 0
    dropped: int = 0
    dropped_stale: int = 0
    refused_stale: int = 0


class ServerState(str, Enum):
    starting = "starting"
    running = "running"
    training = "training"
    paused = "paused"
    stopping = "stopping"
    stopped = "stopped"


class LastError(BaseModel):
    """The newest error the server survived (also published as an ``error`` event): ``where`` is the
    stage (``train_step``, ``publish``, ``checkpoint``), ``at`` a Unix time."""

    where: str
    message: str
    at: float


WorkerState = Literal["syncing", "ready", "draining", "dropped"]


class WorkerStatus(BaseModel):
    """One member of the server's generator pool in ``GET /api/v1/status`` (``id`` "local": the
    server's own generator). ``state``: ``syncing`` (joined, does not hold a version it may serve
    yet), ``ready`` (gets traffic), ``draining`` (leaving, or its log-probs disagree with the
    trainer's), ``dropped`` (missed its lease or stopped answering)."""

    id: str
    engine: str
    version: int | None = None
    state: WorkerState
    tokens_per_s: float = 0.0
    address: str | None = None
    in_flight: int = 0
    capacity: int = 0
    logprob_diff_max: float | None = None


class Status(BaseModel):
    """``GET /api/v1/status``."""

    state: ServerState
    model: str
    policy_version: int
    step: int
    episodes: EpisodeCounts
    groups_pending: int = 0
    clients: int = 0
    config_version: int = 0
    throughput: dict[str, float] = Field(default_factory=dict)
    uptime_s: float = 0.0
    generator: dict[str, Any] = Field(default_factory=dict, description="the generator's engine and health")
    last_error: LastError | None = Field(None, description="the newest error training survived, if any")
    workers: list[WorkerStatus] = Field(default_factory=list, description="the generator pool's members")
    drop_reasons: dict[str, int] = Field(default_factory=dict, description="dropped episodes by reason")
    refusal_reasons: dict[str, int] = Field(default_factory=dict, description="refused_stale by reason")
    recent: RecentCounts = Field(default_factory=RecentCounts, description="counts over the last minute")


class StepMetrics(BaseModel):
    """One training step's metrics; keys are slash-named (``train/reward_mean``)."""

    step: int
    policy_version: int
    time: float
    metrics: dict[str, float]


# --------------------------------------------------------------------------- control


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
