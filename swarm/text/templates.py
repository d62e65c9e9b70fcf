"""Text handling every engine shares: loading a model folder's tokenizer, rendering chat prompts and
stop strings (the request checks are ``swarm.backends.sampling_params``'s). Torch-free, so the vLLM
engine (whose model lives in another process) and the torch engine use the very same rules and
cannot drift apart.

Stop strings act on ids through the tokenizer's decode: ids are cut before the token in which the
stop string begins, so the returned ids decode to exactly the returned text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChatText", "Ending", "Message", "ToolSpec", "decode", "encode", "find_stop", "load_tokenizer",
           "prepare_messages", "render_chat", "safe_prefix_chars"]

# A chat message and a tool definition as OpenAI's JSON spells them (role, content, tool_calls, ...;
# type, function): read here, never changed, and handed to the chat template as they are.
Message = Mapping[str, object]
ToolSpec = Mapping[str, object]

# Folders whose tokenizer_config names the generic fast class are loaded from tokenizer.json as is.
# AutoTokenizer would otherwise swap in the model type's own class (for qwen2: an NFC-normalising,
# regex-splitting tokenizer), which breaks the tiny preset's exact byte round-trip.
_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
_REPLACEMENT = "\ufffd"


def load_tokenizer(folder: str | Path) -> Any:
    """The folder's tokenizer (offline), by the rule above."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(folder)
    config_file = folder / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in _GENERIC_TOKENIZER_CLASSES and (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@dataclass(frozen=True)
class Ending:
    """How a rendered prompt ends (vLLM's request fields): with the assistant's header
    (``add_generation_prompt``, the default), after the last message's end-of-turn, or inside the final
    assistant message, whose text the model then continues (``continue_final_message``)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False


def render_chat(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec] | None,
                template_kwargs: Mapping[str, object] | None = None, ending: Ending = Ending()) -> list[int]:
    """Apply the chat template (ending as ``ending`` says); ``ValueError`` if it cannot render them."""
    text = _render_text(tokenizer, messages, tools, template_kwargs, ending)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _render_text(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec] | None,
                 template_kwargs: Mapping[str, object] | None, ending: Ending = Ending()) -> str:
    from jinja2 import TemplateError

    if not messages:
        raise ValueError("messages must not be empty")
    reserved = {"messages", "tools", "add_generation_prompt", "continue_final_message", "tokenize"}
    if reserved & set(template_kwargs or {}):
        raise ValueError(f"chat_template_kwargs may not set {sorted(reserved & set(template_kwargs or {}))}")
    try:
        return tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=ending.add_generation_prompt,
            continue_final_message=ending.continue_final_message,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except (TemplateError, TypeError, KeyError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot render these messages with the chat template: {exc}") from exc


def prepare_messages(messages: Sequence[Message]) -> list[Message]:
    """Messages as vLLM hands them to a chat template: an assistant's ``tool_calls[].function.arguments``
    sent as a JSON string (OpenAI's wire form) is parsed to a dict, so templates that apply ``tojson``
    render the object, not a double-encoded string. ``ValueError`` for arguments that are not JSON."""
    prepared = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list) and calls:
            message = {**message, "tool_calls": [_parsed_call(i, k, call) for k, call in enumerate(calls)]}
        prepared.append(message)
    return prepared


def _parsed_call(message_index: int, call_index: int, call: object) -> object:
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
    except ValueError as exc:
        raise ValueError(f"messages[{message_index}].tool_calls[{call_index}].function.arguments is not valid "
                         f"JSON: {exc}") from None
    return {**call, "function": {**function, "arguments": arguments}}


# Stands for an assistant message's body when the server splices in the ids it sampled for it
# (private-use characters: no real conversation contains them).
SPLICE_MARK = "\ue000swarm-reply\ue001"


class ChatText:
    """A model folder's tokenizer with every text rule the server needs: rendering (plain, or with a
    reply's sampled ids spliced in), encoding, decoding and per-token bytes. One object per model,
    shared by whatever generator serves it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._bytes: dict[int, list[int]] = {}
        self._byte_of_char = {char: byte for byte, char in enumerate(byte_level_alphabet())}

    @property
    def chat_template(self) -> str | None:
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None,
               template_kwargs: Mapping[str, object] | None = None, ending: Ending = Ending()) -> list[int]:
        """Prompt ids of the conversation, by default with the generation prompt (``ValueError`` if the
        template fails)."""
        return render_chat(self.tokenizer, messages, tools, template_kwargs, ending)

    def render_tail(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None,
                    template_kwargs: Mapping[str, object] | None, index: int, ending: Ending = Ending()) -> list[int] | None:
        """Ids of everything the template renders *after* the body of ``messages[index]`` (an
        assistant message): its end-of-turn token, the later messages, the generation prompt. None
        when the template does not render that message's body exactly once (it drops or repeats it),
        so no splice is possible."""
        marked = [*messages[:index], {"role": "assistant", "content": SPLICE_MARK}, *messages[index + 1:]]
        text = _render_text(self.tokenizer, marked, tools, template_kwargs, ending)
        if text.count(SPLICE_MARK) != 1:
            return None
        return self.encode(text.split(SPLICE_MARK, 1)[1])

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode(self.tokenizer, token_ids)

    def added_token_id(self, text: str) -> int | None:
        """The id of the tokenizer's added token spelled ``text`` (a chat marker such as ``<tool_call>``),
        else None: a forced tool call writes the marker as that one token, as the model does unforced."""
        found = self.tokenizer.get_added_vocab().get(text) if hasattr(self.tokenizer, "get_added_vocab") else None
        return int(found) if isinstance(found, int) else None

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special-token text such as ``<|im_end|>`` becomes its one id."""
        return encode(self.tokenizer, text)

    def token_bytes(self, token_id: int) -> list[int]:
        """The token's own bytes (OpenAI's ``bytes``): what lets a client rebuild a character split
        across tokens that each decode to U+FFFD. Byte-level vocabularies map exactly; others fall
        back to the UTF-8 of the token's text."""
        cached = self._bytes.get(token_id)
        if cached is None:
            piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
            if isinstance(piece, str) and piece and all(ch in self._byte_of_char for ch in piece):
                cached = [self._byte_of_char[ch] for ch in piece]
            else:
                cached = list(self.decode([token_id]).encode())
            self._bytes[token_id] = cached
        return cached


def byte_level_alphabet() -> list[str]:
    """One printable character per byte value, the GPT-2 byte-level convention (byte ``b`` is
    character ``[b]``): how byte-level BPE vocabularies (Qwen, Llama 3, the tiny preset) spell bytes.
    The ``tokenizers`` ByteLevel pre-tokenizer maps raw bytes to exactly these characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars: dict[int, int] = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return [chr(chars[b]) for b in range(256)]


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """Text of ids as clients see it (special tokens skipped): what stop strings are matched against."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of text, no special tokens added (supervised targets); special-token text maps to its id."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def find_stop(text: str, stops: Sequence[str], after: int = 0) -> int:
    """Earliest index where any stop string occurs in ``text`` ending past its first ``after``
    characters (``min_tokens``: vLLM ignores stop strings within the first tokens' text), or -1."""
    hits = [pos for pos in (text.find(s, max(0, after - len(s) + 1)) for s in stops) if pos >= 0]
    return min(hits) if hits else -1


def safe_prefix_chars(text: str, stops: Sequence[str]) -> int:
    """Length of the text that can no longer become part of a stop string.

    A tail that is a prefix of some stop string may still grow into it, and trailing replacement
    characters may be an incomplete multi-byte character that still changes.
    """
    safe = len(text)
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-k:]):
                safe = min(safe, len(text) - k)
                break
    while safe > 0 and text[safe - 1] == _REPLACEMENT:
        safe -= 1
    return safe
