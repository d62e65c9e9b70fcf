"""The swarm side of the vLLM engine's text handling: chat template, encode, decode, stop strings.

The server renders prompts with the model folder's own tokenizer and chat template and sends vLLM
token ids only, so vLLM's tokenizer never decides what a prompt is. Loading, rendering and stop
strings follow ``swarm.text.templates``, the rules the torch engine uses too. vLLM stops generating
at the stop string; where the ids end is decided here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.text.templates import Message, ToolSpec, find_stop, load_tokenizer, render_chat, safe_prefix_chars
from swarm.text.templates import decode as decode_ids
from swarm.text.templates import encode as encode_text

__all__ = ["ChatTokenizer", "cut_at_stop", "releasable"]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, (list, tuple)):
        return {int(v) for v in value}
    return set()


@dataclass
class ChatTokenizer:
    """A model folder's tokenizer plus what sampling needs to know about its vocabulary."""

    tokenizer: Any
    vocab_size: int  # ids the tokenizer can decode; the model's embedding may have more rows
    model_vocab_size: int  # rows of the embedding, i.e. logits vLLM samples from
    eos_ids: frozenset[int]  # ids that end a generation (the torch engine's set)
    max_position_embeddings: int

    @classmethod
    def load(cls, folder: str | Path) -> ChatTokenizer:
        folder = Path(folder)
        config = _read_json(folder / "config.json")
        tokenizer = load_tokenizer(folder)
        model_vocab = int(config.get("vocab_size") or len(tokenizer))
        eos = _ids(config.get("eos_token_id")) | _ids(_read_json(folder / "generation_config.json").get("eos_token_id"))
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            eos.add(im_end)
        return cls(
            tokenizer=tokenizer,
            vocab_size=min(len(tokenizer), model_vocab),
            model_vocab_size=model_vocab,
            eos_ids=frozenset(eos),
            max_position_embeddings=int(config.get("max_position_embeddings") or 2048),
        )

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None) -> list[int]:
        return render_chat(self.tokenizer, messages, tools)

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, token_ids)

    def encode(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)


def cut_at_stop(ids: Sequence[int], stops: Sequence[str], decode: Any, min_tokens: int = 0) -> int | None:
    """How many of ``ids`` to keep if their text contains a stop string, else None.

    The kept ids are the longest prefix whose text ends at or before where the stop string starts.
    With ``min_tokens`` only stop strings ending past the first ``min_tokens`` tokens' text count.
    """
    if not stops or len(ids) <= min_tokens:
        return None
    start = find_stop(decode(ids), stops, after=len(decode(ids[:min_tokens])) if min_tokens else 0)
    if start < 0:
        return None
    keep = len(ids)
    while keep > 0 and len(decode(ids[:keep])) > start:
        keep -= 1
    return keep


def releasable(ids: Sequence[int], stops: Sequence[str], emitted: int, decode: Any) -> int:
    """How many leading ``ids`` can be streamed without risk of a later stop-string cut.

    A text tail that is a prefix of a stop string may still grow into it, and trailing replacement
    characters may be an unfinished multi-byte character.
    """
    if not stops:
        return len(ids)
    safe = safe_prefix_chars(decode(ids), stops)
    count = emitted
    while count < len(ids) and len(decode(ids[: count + 1])) <= safe:
        count += 1
    return count
