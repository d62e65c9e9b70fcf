"""Drift repair: the exact ids this server sampled for every reply it returned, found again when an
agent re-sends the conversation.

An agent sends the whole history on every call, and the chat template re-renders the assistant
messages in it as text. With a real BPE tokenizer that text rarely tokenises back to the ids that
were sampled (a sampled ``'Hel','lo'`` re-encodes as ``'Hello'``; a token that decoded to U+FFFD
cannot be rebuilt; tool-call JSON is re-serialised from the parsed arguments; Qwen3's template drops
earlier ``<think>`` blocks). Re-tokenising would fork the episode's timeline on every turn and train
the model on a context it never saw.

So every episode keeps a ``ReplyBook``: for each reply the server returned, keyed by the
conversation that produced it plus the reply *as returned* (content and tool calls, the way a client
re-sends them), the whole token sequence the model saw and produced (prompt ids + sampled ids). A new
call whose messages start with such a conversation + reply continues that sequence, and only what
follows the reply is rendered by the template (``ChatText.render_tail``). The prompt the model is
given is therefore exactly its own earlier tokens plus the new messages, and the call merges into the
same timeline. A conversation whose history really changed (a turn edited, dropped or reordered)
matches no entry, is rendered plainly and forks, which is counted as drift.

Keys are rolling digests over canonical messages (``conversation_keys``): one per message prefix, so
finding the longest known prefix costs one pass. Reasoning is left out of an assistant message's key:
clients usually drop ``reasoning_content`` when they re-send, and the sampled ids hold it anyway.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from functools import cached_property
from typing import Any

from swarm.protocol import ChatCompletionRequest
from swarm.text.parsers import ParsedReply
from swarm.text.templates import Ending, Message, ToolSpec, prepare_messages

__all__ = ["Conversation", "ReplyBook", "Splice", "conversation_keys", "reply_message"]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _call_arguments(function: Mapping[str, object]) -> object:
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


def _canonical(message: Message) -> dict[str, object]:
    """What identifies a message for matching: an assistant message by its content and calls only
    (ids, reasoning and extra keys vary between clients); any other message by all its keys."""
    if message.get("role") == "assistant":
        sent = message.get("tool_calls")
        calls = [(c.get("function", c).get("name"), _call_arguments(c.get("function", c)))
                 for c in (sent if isinstance(sent, list) else [])]
        return {"role": "assistant", "content": _text(message.get("content")), "tool_calls": calls}
    return {**{k: v for k, v in message.items() if v is not None and k != "content"},
            "content": _text(message.get("content"))}


def _digest(previous: bytes, item: Any) -> bytes:
    body = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(previous + body.encode(), digest_size=16).digest()


def conversation_keys(messages: Sequence[Message], tools: Sequence[ToolSpec] | None,
                      template_kwargs: Mapping[str, object]) -> list[bytes]:
    """``keys[i]`` identifies ``messages[:i + 1]`` rendered with these tools and template variables."""
    key = _digest(b"", {"tools": list(tools or []), "kwargs": template_kwargs})
    keys = []
    for message in messages:
        key = _digest(key, _canonical(message))
        keys.append(key)
    return keys


def reply_message(reply: ParsedReply) -> Message:
    """The assistant message a client re-sends for ``reply`` (OpenAI's shape)."""
    calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
             for c in reply.tool_calls]
    return {"role": "assistant", "content": reply.content, "tool_calls": calls}


def extend_key(conversation_key: bytes, reply: ParsedReply) -> bytes:
    """The key of a conversation followed by ``reply``."""
    return _digest(conversation_key, _canonical(reply_message(reply)))


@dataclass(frozen=True)
class Splice:
    """A known reply found in a new call: ``messages[index]`` is it, and ``tokens`` is everything the
    model saw and sampled up to the end of it."""

    index: int
    tokens: list[int]


class ReplyBook:
    """One episode's replies by conversation key (see the module docstring). It keeps the newest
    ``capacity`` replies: each entry is a whole token sequence, and agents re-send recent history; a
    call that continues an older branch than that is rendered plainly (and counted if it forks)."""

    def __init__(self, capacity: int = 64) -> None:
        self._tokens: dict[bytes, list[int]] = {}
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, conversation_key: bytes, reply: ParsedReply, tokens: list[int]) -> None:
        key = extend_key(conversation_key, reply)
        self._tokens.pop(key, None)
        self._tokens[key] = tokens
        while len(self._tokens) > self.capacity:
            del self._tokens[next(iter(self._tokens))]  # dicts keep insertion order: the oldest first

    def longest(self, messages: Sequence[Message], keys: Sequence[bytes]) -> Splice | None:
        """The last assistant message of ``messages`` that ends a known conversation, if any."""
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].get("role") == "assistant" and keys[index] in self._tokens:
                return Splice(index=index, tokens=self._tokens[keys[index]])
        return None


class Conversation:
    """A chat call's conversation as the template renders it: the messages (``prepare_messages``), the
    template's variables (the server's defaults, ``reasoning_effort``, then the request's
    ``chat_template_kwargs``, as vLLM merges them), how the prompt ends, and the keys of its prefixes.
    ``ValueError`` for messages the template cannot take (tool-call arguments that are not JSON)."""

    def __init__(self, request: ChatCompletionRequest, defaults: Mapping[str, object]) -> None:
        effort = {"reasoning_effort": request.reasoning_effort} if request.reasoning_effort is not None else {}
        self.tools = request.tools
        self.kwargs = {**defaults, **effort, **(request.chat_template_kwargs or {})}
        self.ending = Ending(add_generation_prompt=request.add_generation_prompt,
                             continue_final_message=request.continue_final_message)
        self.messages = prepare_messages([m.model_dump(exclude_none=True) for m in request.messages])

    @cached_property
    def keys(self) -> list[bytes]:
        """``keys[i]`` identifies ``messages[:i + 1]`` with these tools, variables and ending."""
        keyed = self.kwargs if self.ending == Ending() else {**self.kwargs, "ending": [*astuple(self.ending)]}
        return conversation_keys(self.messages, self.tools, keyed)

    def splice(self, book: ReplyBook) -> Splice | None:
        """The longest reply of ``book`` this conversation re-sends (a final assistant message being
        continued is never one: the model goes on writing it)."""
        ending = self.ending.continue_final_message
        return book.longest(self.messages[:-1] if ending else self.messages, self.keys)
