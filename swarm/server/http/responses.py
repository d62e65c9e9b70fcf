"""The Responses API served through chat completions: one generation path for both.

``chat_request`` turns a ``ResponsesRequest`` into the ``ChatCompletionRequest`` the chat route would
get for the same conversation (``instructions`` a system message first; ``message`` items by role;
an assistant ``message`` and the ``function_call`` items after it one assistant turn with
``tool_calls``; ``function_call_output`` items tool messages; re-sent ``reasoning`` items dropped,
since drift repair splices in the ids that were sampled for them), so rendering, recording, merging
and drift repair are exactly those of chat and a Responses agent's episode trains one sample.
``ResponseShape`` turns the parsed answer back into output items: ``reasoning`` (the reasoning
parser's text), ``message`` (the content; present unless the reply is only tool calls) and one
``function_call`` per parsed call, in that order, with ids derived from the response's id so the
streamed items and the final response agree.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from swarm.backends.base import Generation
from swarm.protocol import ChatCompletionRequest, TokenLogprob
from swarm.protocol.responses import (
    FunctionCallItem,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from swarm.server.episodes.completions import Answer
from swarm.server.errors import BadRequest
from swarm.server.http.replyshape import token_logprobs
from swarm.text.parsers import ParsedReply
from swarm.text.templates import ChatText

__all__ = ["ResponseShape", "chat_request", "input_messages"]

_TEXT_PARTS = ("input_text", "output_text", "text")
_LOGPROBS = "message.output_text.logprobs"


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion this request stands for (a 400 naming what cannot be translated)."""
    effort = body.reasoning.effort if body.reasoning is not None else None
    logprobs = _LOGPROBS in (body.include or ()) or bool(body.top_logprobs)
    fields: dict[str, object] = {
        "messages": input_messages(body.input, body.instructions), "tools": _chat_tools(body.tools),
        "tool_choice": _chat_tool_choice(body.tool_choice), "max_completion_tokens": body.max_output_tokens,
        "response_format": _response_format(body.text),
        "temperature": body.temperature, "top_p": body.top_p, "logprobs": logprobs,
        "top_logprobs": body.top_logprobs if logprobs else None, "stream": bool(body.stream),
        "reasoning_effort": effort,
    }
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"input cannot be served as a chat: {where}: {first['msg']}") from None


def _chat_tool_choice(choice: object) -> object:
    """The Responses API's flat named choice (``{"type": "function", "name": ...}``) in chat's nested form."""
    if isinstance(choice, Mapping):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Mapping[str, object] | None) -> dict[str, object] | None:
    """``text.format`` as chat's ``response_format``: a json_schema format's fields move under ``json_schema``."""
    fmt = (text or {}).get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type", "text") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return dict(fmt)


def input_messages(items: str | Sequence[Mapping[str, object]], instructions: str | None) -> list[dict[str, object]]:
    """Chat messages of a Responses ``input`` (text, or items) after ``instructions``."""
    messages: list[dict[str, object]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"input[{i}]: a message's role must be user, system, developer or assistant, "
                                 f"not {role!r}")
            messages.append({"role": role, "content": _text(i, item.get("content"))})
        elif kind == "function_call":
            _add_call(messages, i, item)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(i, item, "call_id"),
                             "content": _text(i, item.get("output"))})
        elif kind != "reasoning":
            raise BadRequest(f"input[{i}]: items of type {kind!r} are not served: this server takes messages, "
                             "function_call, function_call_output and reasoning items (it keeps no stored "
                             "items and runs no built-in tools)")
    if not messages:
        raise BadRequest("input holds no message to answer")
    return messages


def _add_call(messages: list[dict[str, object]], index: int, item: Mapping[str, object]) -> None:
    """A ``function_call`` joins the assistant turn before it (its text and earlier calls), as the
    chat message the server returned held them together."""
    call = {"id": _string(index, item, "call_id"), "type": "function",
            "function": {"name": _string(index, item, "name"), "arguments": _string(index, item, "arguments")}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        earlier = last.get("tool_calls")
        last["tool_calls"] = [*(earlier if isinstance(earlier, list) else []), call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _string(index: int, item: Mapping[str, object], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"input[{index}].{key} must be a string")
    return value


def _text(index: int, content: Any) -> str:
    """A message's (or a tool output's) text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"input[{index}].content must be a string or a list of content parts")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        elif kind in _TEXT_PARTS:
            texts.append(str(part.get("text", "")))
        else:
            raise BadRequest(f"input[{index}].content[{k}]: content parts of type {kind!r} are not served "
                             "(this server's model reads text only): send input_text parts")
    return "".join(texts)


def _chat_tools(tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
    """Responses function tools as chat tools (``strict`` is not enforced: sampling is never constrained)."""
    if not tools:
        return None
    converted: list[dict[str, object]] = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}]: type {tool.get('type')!r} is not served: only function tools with a "
                             "name (the model's calls are parsed from its text; no built-in tool runs here)")
        function: dict[str, object] = {"name": tool["name"]}  # chat's key order, so the template renders the same tool text
        if tool.get("description"):
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        converted.append({"type": "function", "function": function})
    return converted


@dataclass
class ResponseShape:
    """One response's identity and echo of its request; builds its output items and whole object."""

    body: ResponsesRequest
    model: str
    text: ChatText
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created_at: float = field(default_factory=time.time)
    episode_id: str | None = None  # the episode the call is recorded into, once started

    @property
    def message_id(self) -> str:
        return "msg_" + self.id.removeprefix("resp_")

    @property
    def reasoning_id(self) -> str:
        return "rs_" + self.id.removeprefix("resp_")

    def items(self, gen: Generation, reply: ParsedReply) -> list[OutputItem]:
        """The reply's output items, in streaming order."""
        items: list[OutputItem] = []
        if reply.reasoning:
            items.append(ReasoningItem(id=self.reasoning_id, content=[ReasoningText(text=reply.reasoning)]))
        if reply.content is not None or not reply.tool_calls:
            status = "incomplete" if gen.finish_reason == "length" else "completed"
            part = OutputText(text=reply.content or "", logprobs=self.logprobs(gen))
            items.append(OutputMessage(id=self.message_id, status=status, content=[part]))
        items.extend(function_call(call.id, call.name, call.arguments) for call in reply.tool_calls)
        return items

    def logprobs(self, gen: Generation) -> list[TokenLogprob] | None:
        """Every generated token's log-prob entry, when the request asked for log-probs."""
        if not (_LOGPROBS in (self.body.include or ()) or self.body.top_logprobs):
            return None
        return token_logprobs(self.text, gen.token_ids, gen.logprobs, gen.top_logprobs)

    def started(self, policy_version: int) -> ResponseObject:
        return self._object("in_progress", policy_version)

    def finished(self, prompt: list[int], answer: Answer) -> ResponseObject:
        gen, reply = answer.sampled.generations[0], answer.replies[0]
        cut = gen.finish_reason == "length"
        done = self._object("incomplete" if cut else "completed", answer.sampled.policy_version)
        done.output = self.items(gen, reply)
        done.incomplete_details = {"reason": "max_output_tokens"} if cut else None
        done.usage = ResponseUsage(input_tokens=len(prompt), output_tokens=len(gen.token_ids),
                                   total_tokens=len(prompt) + len(gen.token_ids))
        done.prompt_token_ids, done.token_ids = list(prompt), list(gen.token_ids)
        return done

    def failed(self, policy_version: int, code: str, message: str) -> ResponseObject:
        failed = self._object("failed", policy_version)
        failed.error = {"code": code, "message": message}
        return failed

    def _object(self, status: Any, policy_version: int) -> ResponseObject:
        body = self.body
        return ResponseObject(
            id=self.id, created_at=self.created_at, model=self.model, status=status,
            instructions=body.instructions, tools=body.tools or [], tool_choice=body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False, temperature=body.temperature,
            top_p=body.top_p, max_output_tokens=body.max_output_tokens, metadata=body.metadata,
            reasoning=body.reasoning, policy_version=policy_version, episode_id=self.episode_id,
            text=body.text or {"format": {"type": "text"}})


def function_call(call_id: str, name: str, arguments: str) -> FunctionCallItem:
    return FunctionCallItem(id="fc_" + call_id.removeprefix("call_"), call_id=call_id, name=name, arguments=arguments)
