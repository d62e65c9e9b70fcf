"""OpenAI's shapes of a generated reply, shared by the JSON and the streaming chat routes: per-token
log-prob entries (with each token's bytes and top alternatives), tool calls and the finish reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from swarm.backends.base import Generation, TopAlternatives
from swarm.protocol import FunctionCall, TokenLogprob, ToolCall, TopLogprob
from swarm.text.parsers import ParsedReply
from swarm.text.parsers import ToolCall as ParsedToolCall
from swarm.text.templates import ChatText

__all__ = ["finish_reason", "token_logprobs", "wire_tool_call"]


def finish_reason(gen: Generation, reply: ParsedReply) -> Literal["stop", "length", "tool_calls"]:
    """vLLM's rule: a reply that called tools finishes with ``tool_calls``."""
    return "tool_calls" if reply.tool_calls else gen.finish_reason


def wire_tool_call(call: ParsedToolCall) -> ToolCall:
    return ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


def token_logprobs(text: ChatText, ids: Sequence[int], logprobs: Sequence[float],
                   top: Sequence[TopAlternatives | None] | None) -> list[TokenLogprob]:
    """OpenAI's per-token log-prob entries: each token's text, log-prob and bytes, and its top
    alternatives when the generator gave them."""
    return [TokenLogprob(token=text.decode([t]), logprob=lp, bytes=text.token_bytes(t),
                         top_logprobs=_alternatives(text, top[i] if top else None))
            for i, (t, lp) in enumerate(zip(ids, logprobs, strict=True))]


def _alternatives(text: ChatText, top: TopAlternatives | None) -> list[TopLogprob]:
    return [TopLogprob(token=text.decode([a]), logprob=alp, bytes=text.token_bytes(a)) for a, alp in (top or ())]
