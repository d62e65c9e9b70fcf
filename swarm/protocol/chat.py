"""The OpenAI chat-completions contract: requests, choices, log-probs, the model list.
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swarm.protocol._base import _Wire, refused

__all__ = ["PASS_THROUGH_FIELDS", "AssistantMessage", "ChatCompletion", "ChatCompletionRequest", "ChatMessage", "Choice",
           "ChoiceLogprobs", "FunctionCall", "ModelCard", "ModelList", "ReasoningEffort", "TokenLogprob", "ToolCall",
           "ToolChoice", "TopLogprob", "Usage"]

class ChatMessage(BaseModel):
    """A chat message as OpenAI clients send it; extra keys (name, tool_call_id, …) are kept."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer", "function"]  # function: legacy, read as tool
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
    OpenAI's deprecated ``functions``/``function_call`` (and ``function`` messages, an assistant's
    ``function_call``) are read as the ``tools``/``tool_choice`` they stand for; replies come back as
    ``tool_calls``, which every SDK that sends the legacy form also reads.
    """

    model: str | None = Field(None, description="echoed in the answer; with --served-model-name, one of those names")
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
    response_format: dict[str, Any] | None = Field(None, description="text, json_object or json_schema (constrained "
                                                   "decoding)")
    # OpenAI's deprecated function-calling fields, read as ``tools``/``tool_choice`` (``_legacy_functions``).
    functions: list[dict[str, Any]] | None = Field(None, description="legacy: read as tools")
    function_call: Literal["none", "auto"] | dict[str, Any] | None = Field(None, description="legacy: read as "
                                                                            "tool_choice")
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
    def _legacy_functions(self) -> ChatCompletionRequest:
        """``functions``/``function_call`` as the ``tools``/``tool_choice`` OpenAI defines them to be, and a
        legacy conversation's ``function_call`` turns and ``function`` results as tool calls and tool messages."""
        if self.functions is not None:
            if self.tools is not None:
                raise refused("functions: send tools or the legacy functions, not both")
            self.tools, self.functions = [{"type": "function", "function": f} for f in self.functions], None
        if self.function_call is not None:
            if self.tool_choice is not None:
                raise refused("function_call: send tool_choice or the legacy function_call, not both")
            if isinstance(self.function_call, dict):  # {"name": ...}: that function, forced
                name = self.function_call.get("name")
                if name not in [t["function"].get("name") for t in self.tools or ()]:
                    raise refused(f"function_call: no function named {name!r} among the functions sent")
                self.tool_choice = {"type": "function", "function": {"name": name}}
            else:
                self.tool_choice = self.function_call
            self.function_call = None
        self.messages = _legacy_messages(self.messages)
        return self

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
    def _response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """OpenAI's three kinds; json ones are served by constrained decoding (``swarm.text.constraints``)."""
        kind = (value or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise refused(f"type {kind!r} is not served: text, json_object or json_schema")
        spec = (value or {}).get("json_schema")
        if kind == "json_schema" and not (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
            raise refused('json_schema: {"name": ..., "schema": {...}, "strict": ...} with a schema object is needed')
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_shape(cls, value: ToolChoice | None) -> ToolChoice | None:
        """A named function is ``{"type": "function", "function": {"name": ...}}`` (forced by constrained decoding)."""
        if isinstance(value, dict):
            function = value.get("function")
            if value.get("type") != "function" or not (isinstance(function, dict)
                                                       and isinstance(function.get("name"), str)):
                raise refused('a named tool_choice is {"type": "function", "function": {"name": ...}}')
        return value

    @model_validator(mode="after")
    def _forced_call_has_its_tool(self) -> ChatCompletionRequest:
        """``required`` or a named function forces a call (constrained decoding): it needs that tool."""
        choice = self.tool_choice
        if choice == "required" or isinstance(choice, dict):
            names = [t.get("function", {}).get("name") for t in self.tools or () if isinstance(t.get("function"), dict)]
            if not names:
                raise refused("tool_choice: forcing a call needs tools")
            if isinstance(choice, dict) and choice["function"]["name"] not in names:
                raise refused(f"tool_choice: no tool named {choice['function']['name']!r} (tools: {', '.join(names)})")
        return self


def _legacy_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A legacy conversation as tool messages: an assistant's ``function_call`` becomes one tool call
    (id ``call_<index>``) and a following ``function`` message that tool's result (OpenAI's legacy
    form carries no ids, so each result answers the latest call)."""
    if not any(m.role == "function" or getattr(m, "function_call", None) for m in messages):
        return messages
    out: list[ChatMessage] = []
    call_id: str | None = None
    for i, message in enumerate(messages):
        call = (message.model_extra or {}).get("function_call")
        if message.role == "assistant" and isinstance(call, dict) and not message.tool_calls:
            call_id = f"call_{i}"
            message = ChatMessage(**{**message.model_dump(exclude={"function_call"}),
                                     "tool_calls": [{"id": call_id, "type": "function", "function": call}]})
        elif message.role == "function":
            message = ChatMessage(**{**message.model_dump(), "role": "tool", "tool_call_id": call_id or f"call_{i}"})
        out.append(message)
    return out


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="a JSON object, serialised")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TopLogprob(BaseModel):
    """One of a sampled token's most likely alternatives (OpenAI's ``top_logprobs`` entry)."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


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
    root: str | None = Field(None, description="the model served under this name (vLLM's field)")
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
