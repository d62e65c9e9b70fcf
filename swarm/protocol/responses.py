"""The Responses API's wire contract (``POST /v1/responses``), beside ``swarm.protocol``'s chat API.

A request is served by translating it to a chat completion (``swarm.server.http.responses``), so its
tokens, merge and drift repair are those of chat. The server is stateless, as with ``store=false``:
everything a call needs travels in its ``input`` (``previous_response_id``, ``conversation`` and
``store=true`` are refused). Every field is honoured, refused with a 400 naming it, or passed over
because it cannot change a sample (``RESPONSES_PASS_THROUGH``); an unknown field is a 400 naming it.

Kept out of ``swarm.protocol`` so that module stays one readable chat-and-episodes contract; like it,
this module depends on pydantic only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.protocol._base import refused
from swarm.protocol.chat import ReasoningEffort, TokenLogprob

# Fields that cannot change what is sampled: accepted and passed over.
RESPONSES_PASS_THROUGH = ("user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key",
                          "prompt_cache_retention", "prompt_cache_options")
# ``include`` values: log-probs are honoured; nothing is ever encrypted, so asking for it changes nothing.
INCLUDE_SERVED = ("message.output_text.logprobs", "reasoning.encrypted_content")


class ReasoningOptions(BaseModel):
    """``reasoning``: ``effort`` goes to the chat template as ``reasoning_effort`` (vLLM's kwarg); the
    reasoning parser's whole text comes back in a ``reasoning`` item, so a summary kind changes nothing."""

    model_config = ConfigDict(extra="forbid")

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: OpenAI's fields, each honoured, refused (400 naming it) or passed over."""

    model_config = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=4.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    reasoning: ReasoningOptions | None = None
    text: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Refused unless unset (the server keeps no state between calls).
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    max_tool_calls: int | None = None
    context_management: Any = None
    model: str | None = None  # echoed in the response; with --served-model-name, one of those names
    # Pass-through (RESPONSES_PASS_THROUGH).
    user: str | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        """A named function is ``{"type": "function", "name": ...}`` (forced by constrained decoding)."""
        if isinstance(value, dict) and not (value.get("type") == "function" and isinstance(value.get("name"), str)):
            raise refused('a named tool_choice is {"type": "function", "name": ...}; built-in tools are not run here')
        return value

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[str] | None) -> list[str] | None:
        unserved = [v for v in value or () if v not in INCLUDE_SERVED]
        if unserved:
            raise refused(f"{unserved} name outputs of tools this server does not run; "
                          f"it serves {list(INCLUDE_SERVED)}")
        return value

    @field_validator("text")
    @classmethod
    def _text(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """``format``: text, json_object or json_schema (``{"type": "json_schema", "name": ..., "schema":
        {...}, "strict": ...}``), the json ones served by constrained decoding."""
        fmt = (value or {}).get("format") or {}
        kind = fmt.get("type", "text")
        if set(value or {}) - {"format"}:
            raise refused(f"only format is served, not {sorted(set(value or {}) - {'format'})}")
        if kind not in ("text", "json_object", "json_schema"):
            raise refused(f"format type {kind!r} is not served: text, json_object or json_schema")
        if kind == "json_schema" and not isinstance(fmt.get("schema"), dict):
            raise refused('format json_schema needs {"name": ..., "schema": {...}} with a schema object')
        return value

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        for name, why in _REFUSED.items():
            value = getattr(self, name)
            if value is not None and value is not False and not (name == "truncation" and value == "disabled"):
                raise refused(f"{name}: {why}")
        if self.stream_options is not None and not self.stream:
            raise refused("stream_options: only allowed with stream=true")
        return self


_STATELESS = "this server keeps no responses (store=false semantics): send the whole conversation as input"
_REFUSED = {
    "store": f"store=true is not served; {_STATELESS}",
    "previous_response_id": _STATELESS,
    "conversation": _STATELESS,
    "background": "background responses need stored state; call without it and wait for the answer",
    "prompt": "stored prompt templates live on OpenAI's platform; send instructions and input instead",
    "max_tool_calls": "built-in tools are not run here; function calls are parsed from what the model writes",
    "context_management": "the server never rewrites a conversation: what the model sees is what trains",
    "truncation": "'auto' would drop input items silently; too long a prompt is a 400 (truncation 'disabled')",
}


# --------------------------------------------------------------------------- output


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})


class ResponseObject(BaseModel):
    """A response as OpenAI returns it, plus vLLM's ``prompt_token_ids``, the generated ``token_ids``
    and the ``policy_version`` that sampled them."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, Any] | None = None
    reasoning: ReasoningOptions | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    store: bool = False
    truncation: Literal["disabled"] = "disabled"
    prompt_token_ids: list[int] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    policy_version: int = 0
    episode_id: str | None = None  # the episode it was recorded into (also the x-swarm-episode header)
