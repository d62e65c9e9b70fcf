"""Text-layer parsers that turn a decoded reply into an OpenAI assistant message: reasoning
(``message.reasoning_content``) and tool calls (``message.tool_calls``), named and shaped like vLLM's
OpenAI server with ``--enable-auto-tool-choice --tool-call-parser NAME --reasoning-parser NAME``.

They read text (special tokens already skipped): the markers they look for (``<think>``,
``<tool_call>``) are ordinary tokens that survive decoding. Pure Python, so every engine shares one
set of rules. The reasoning parser splits the whole reply first; the tool parser reads what is left.

``ReplyStream`` is the incremental view for SSE. It emits only text certain to be a prefix of the
final fields, so the streamed deltas always add up to what ``parse_reply`` returns for the final
text; tool calls themselves are sent once, at the end, rather than as argument fragments.

Choices where vLLM has no single answer (each documented on its parser):
- ``<think>`` may follow leading whitespace; that whitespace and the marker are dropped.
- Content after ``</think>`` keeps its leading whitespace (``"\\n\\n"``), as vLLM does.
- An empty reasoning or content field is ``None`` (vLLM sends ``None`` for empty content).
- A malformed call never raises: the reply comes back as plain content with ``parse_error`` set.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ParsedReply",
    "ReplyStream",
    "ToolCall",
    "check_parser_names",
    "parse_reply",
    "resolve_tool_parser",
]

log = logging.getLogger(__name__)

_THINK_START, _THINK_END = "<think>", "</think>"
_CALL_START, _CALL_END = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ToolCall:
    """One function call as OpenAI returns it: ``arguments`` is a JSON object serialised as text."""

    name: str
    arguments: str
    id: str


@dataclass(frozen=True)
class ParsedReply:
    """An assistant reply split into OpenAI message fields.

    ``parse_error`` is set when the text looked like a tool call but did not parse; ``content`` is
    then the whole text after the reasoning split and ``tool_calls`` is empty, so the client (and
    the reward) sees exactly what the model wrote. With ``parallel_tool_calls=false`` only the first
    call is a call; the text of the others is appended to ``content`` and counted in ``extra_calls``.
    """

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    parse_error: str | None = None
    extra_calls: int = 0  # calls past the first of a parallel_tool_calls=false reply, returned as content


class _BadCall(ValueError):
    """The text looked like a tool call but is not a valid one; the message says why."""


def _new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``: it may still
    grow into the marker, so a stream must not emit it yet."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def _undecided(head: str, marker: str) -> bool:
    """True while ``head`` (possibly empty) could still grow into ``marker``."""
    return len(head) < len(marker) and marker.startswith(head)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _call_from_json(obj: Any, argument_keys: tuple[str, ...]) -> ToolCall:
    """A ``ToolCall`` from a decoded call object, or ``_BadCall``. Arguments sent as a JSON string
    holding an object are accepted too (some fine-tunes double-encode them)."""
    if not isinstance(obj, dict):
        raise _BadCall("tool call is not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _BadCall('tool call has no "name" string')
    key = next((k for k in argument_keys if k in obj), None)
    if key is None:
        raise _BadCall("tool call has no " + " or ".join(f'"{k}"' for k in argument_keys))
    arguments = obj[key]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise _BadCall(f'tool call "{key}" is a string that is not JSON') from None
    if not isinstance(arguments, dict):
        raise _BadCall(f'tool call "{key}" is not a JSON object')
    return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False), id=_new_call_id())


class _ReasoningParser(Protocol):
    def split(self, text: str) -> tuple[str | None, str]:
        """``(reasoning or None if the reply has none, content text)`` of a finished reply."""

    def stable(self, text: str) -> tuple[str, str]:
        """For a reply still growing: ``(reasoning, content text)`` that are prefixes of what
        ``split`` will return for any continuation."""


class _ToolParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall], int] | None:
        """``(content, calls, where the second call's text starts in text)``; ``None`` when the text
        holds no tool call; ``_BadCall`` when it looks like one but does not parse."""

    def stable(self, text: str) -> str:
        """For content still growing: a prefix of the final content for any continuation."""


class _ThinkTags:
    """``<think>reasoning</think>content``.

    qwen3 (``opened_by_prompt=False``; Qwen3 up to the 2507 release): the model writes ``<think>``
    itself, so a reply that does not start with it (after optional whitespace) has no reasoning.
    deepseek_r1 (``opened_by_prompt=True``): the template ends the prompt with ``<think>``, so the
    reply is reasoning up to ``</think>`` whether or not the model repeats ``<think>``.
    Without ``</think>`` (cut off by the length limit) everything after ``<think>`` is reasoning
    and the content is empty, for both.
    """

    def __init__(self, *, opened_by_prompt: bool) -> None:
        self._opened_by_prompt = opened_by_prompt

    def _body(self, text: str) -> str | None:
        """The text after the opening marker, or ``None`` when there is no reasoning at all."""
        head = text.lstrip()
        if head.startswith(_THINK_START):
            return head[len(_THINK_START) :]
        return text if self._opened_by_prompt else None

    def split(self, text: str) -> tuple[str | None, str]:
        body = self._body(text)
        if body is None:
            return None, text
        reasoning, _, content = body.partition(_THINK_END)
        return reasoning, content

    def stable(self, text: str) -> tuple[str, str]:
        if _undecided(text.lstrip(), _THINK_START):
            return "", ""
        body = self._body(text)
        if body is None:
            return "", text
        reasoning, found, content = body.partition(_THINK_END)
        if found:
            return reasoning, content
        return body[: len(body) - _partial_marker_len(body, _THINK_END)], ""


class _Hermes:
    """Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several calls are allowed; the last may lack ``</tool_call>`` (generation stopped on the end
    token) if its JSON is complete. Content is the text before the first ``<tool_call>``,
    right-stripped; text between and after calls is dropped, as vLLM does.
    """

    def parse(self, text: str) -> tuple[str, list[ToolCall], int] | None:
        first = text.find(_CALL_START)
        if first < 0:
            return None
        calls: list[ToolCall] = []
        start, second = first, len(text)
        while start >= 0:
            if len(calls) == 1:
                second = start
            body_start = start + len(_CALL_START)
            end = text.find(_CALL_END, body_start)
            body = text[body_start:] if end < 0 else text[body_start:end]
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as exc:
                unclosed = f" (no {_CALL_END})" if end < 0 else ""
                raise _BadCall(f"tool call {len(calls) + 1}{unclosed} is not valid JSON: {exc.msg}") from None
            calls.append(_call_from_json(obj, ("arguments",)))
            if end < 0:
                break
            start = text.find(_CALL_START, end + len(_CALL_END))
        return text[:first].rstrip(), calls, second

    def stable(self, text: str) -> str:
        # Whether the calls parse or not, the final content starts with the text before the first
        # marker, right-stripped; a tail that may become the marker, and trailing space, must wait.
        first = text.find(_CALL_START)
        if first >= 0:
            return text[:first].rstrip()
        return text[: len(text) - _partial_marker_len(text, _CALL_START)].rstrip()


class _Llama3Json:
    """Llama 3.1/3.2 JSON calls: after optional whitespace and an optional ``<|python_tag|>``, the
    whole reply is one or more ``{"name": ..., "parameters": {...}}`` objects (``"arguments"`` is
    accepted too) separated by ``;``. Only a reply that starts so is a call (vLLM also searches
    for JSON further in; we do not, so prose quoting JSON stays prose).
    """

    def parse(self, text: str) -> tuple[str, list[ToolCall], int] | None:
        head = text.lstrip()
        if head.startswith(_PYTHON_TAG):
            head = head[len(_PYTHON_TAG) :]
        elif not head.startswith("{"):
            return None
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        pos, second = _skip_space(head, 0), len(head)
        while True:
            if len(calls) == 1:
                second = pos
            try:
                obj, pos = decoder.raw_decode(head, pos)
            except json.JSONDecodeError as exc:
                raise _BadCall(f"tool call {len(calls) + 1} is not valid JSON: {exc.msg}") from None
            calls.append(_call_from_json(obj, ("arguments", "parameters")))
            pos = _skip_space(head, pos)
            if pos < len(head) and head[pos] == ";":
                pos = _skip_space(head, pos + 1)
            elif pos < len(head):
                raise _BadCall(f"unexpected text after tool call {len(calls)}: calls must be separated by ';'")
            if pos == len(head):
                return "", calls, len(text) - len(head) + second  # head is a suffix of text

    def stable(self, text: str) -> str:
        head = text.lstrip()
        if _undecided(head, _PYTHON_TAG) or head.startswith((_PYTHON_TAG, "{")):
            return ""
        return text


_TOOL_PARSERS: dict[str, _ToolParser] = {"hermes": _Hermes(), "llama3_json": _Llama3Json()}
_REASONING_PARSERS: dict[str, _ReasoningParser] = {
    "qwen3": _ThinkTags(opened_by_prompt=False),
    "deepseek_r1": _ThinkTags(opened_by_prompt=True),
}
TOOL_CALL_PARSERS: tuple[str, ...] = tuple(_TOOL_PARSERS)
REASONING_PARSERS: tuple[str, ...] = tuple(_REASONING_PARSERS)


def check_parser_names(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    """``ValueError`` naming the unknown name and the known ones. ``tool_call_parser`` may also be
    "auto" or "none"; ``reasoning_parser`` may be ``None`` or "none"."""
    tool_names = ("auto", "none", *TOOL_CALL_PARSERS)
    if tool_call_parser is not None and tool_call_parser not in tool_names:
        raise ValueError(f"unknown tool call parser {tool_call_parser!r}; known: {', '.join(tool_names)}")
    reasoning_names = ("none", *REASONING_PARSERS)
    if reasoning_parser is not None and reasoning_parser not in reasoning_names:
        raise ValueError(f"unknown reasoning parser {reasoning_parser!r}; known: {', '.join(reasoning_names)}")


def resolve_tool_parser(name: str | None, chat_template: str | None) -> str | None:
    """The registered parser ``name`` stands for. "auto" reads the chat template: "hermes" when it
    mentions ``<tool_call>``, "llama3_json" when it mentions ``<|python_tag|>`` or ``<|eot_id|>``,
    else ``None`` (tool calls are then never parsed); "none" or ``None`` give ``None``."""
    check_parser_names(name, None)
    if name is None or name == "none":
        return None
    if name != "auto":
        return name
    template = chat_template or ""
    if _CALL_START in template:
        return "hermes"
    if _PYTHON_TAG in template or "<|eot_id|>" in template:
        return "llama3_json"
    return None


def _lookup(
    tool_parser: str | None, reasoning_parser: str | None
) -> tuple[_ToolParser | None, _ReasoningParser | None]:
    """The parser objects for registered names ("none" and ``None`` mean no parser)."""
    if tool_parser == "auto":
        raise ValueError('tool parser "auto" must be resolved with resolve_tool_parser first')
    check_parser_names(tool_parser, reasoning_parser)
    tools = None if tool_parser in (None, "none") else _TOOL_PARSERS[tool_parser]
    thinker = None if reasoning_parser in (None, "none") else _REASONING_PARSERS[reasoning_parser]
    return tools, thinker


def parse_reply(
    text: str, *, tool_parser: str | None, reasoning_parser: str | None, parallel_tool_calls: bool = True
) -> ParsedReply:
    """Reasoning split first (on the whole text), then tool calls on the remaining content.

    ``tool_parser`` ``None`` never parses tool calls (no tools in the request, or
    ``tool_choice="none"``). ``parallel_tool_calls=False`` keeps only the first call as a call; the
    others must still parse (they are part of the reply) and come back as content, counted.
    """
    tools, thinker = _lookup(tool_parser, reasoning_parser)
    reasoning, content = thinker.split(text) if thinker is not None else (None, text)
    reasoning = reasoning or None
    if tools is None:
        return ParsedReply(content=content or None, reasoning=reasoning)
    try:
        found = tools.parse(content)
    except _BadCall as exc:
        return ParsedReply(content=content or None, reasoning=reasoning, parse_error=str(exc))
    if found is None:
        return ParsedReply(content=content or None, reasoning=reasoning)
    before, calls, second = found
    if parallel_tool_calls or len(calls) == 1:
        return ParsedReply(content=before or None, reasoning=reasoning, tool_calls=tuple(calls))
    rest = content[second:].strip()  # the other calls' text, as the model wrote it
    return ParsedReply(content="\n".join(filter(None, (before, rest))), reasoning=reasoning,
                       tool_calls=tuple(calls[:1]), extra_calls=len(calls) - 1)


class ReplyStream:
    """Incremental view for streaming (SSE): splits a growing reply into reasoning and content deltas.

    Text that may still turn out to be a marker (``<think>``, ``</think>``, ``<tool_call>``, a
    leading ``{`` or ``<|python_tag|>`` for llama3_json), everything from a tool-call marker on, and
    trailing whitespace of content while a tool parser is active are held back until ``finish``.
    """

    def __init__(self, *, tool_parser: str | None, reasoning_parser: str | None) -> None:
        self._tools, self._thinker = _lookup(tool_parser, reasoning_parser)
        self._reasoning = ""
        self._content = ""

    def push(self, text: str) -> tuple[str, str]:
        """``text`` is the WHOLE reply text so far and only grows (the caller holds back a tail
        that may still change, such as an incomplete multi-byte character). Returns
        ``(reasoning_delta, content_delta)`` that are now final."""
        reasoning, content = self._thinker.stable(text) if self._thinker is not None else ("", text)
        if self._tools is not None:
            content = self._tools.stable(content)
        return self._advance(reasoning, content)

    def finish(self, parsed: ParsedReply) -> tuple[str, str]:
        """Given ``parse_reply`` of the final text, the remaining ``(reasoning_delta, content_delta)``."""
        reasoning, content = parsed.reasoning or "", parsed.content or ""
        if not (reasoning.startswith(self._reasoning) and content.startswith(self._content)):
            log.error("streamed text is not a prefix of the final reply; the stream and the final message differ")
        return self._advance(reasoning, content)

    def _advance(self, reasoning: str, content: str) -> tuple[str, str]:
        """Deltas from what was sent to the given certain prefixes; a shorter prefix sends nothing."""
        reasoning_delta = reasoning[len(self._reasoning) :]
        content_delta = content[len(self._content) :]
        self._reasoning += reasoning_delta
        self._content += content_delta
        return reasoning_delta, content_delta
