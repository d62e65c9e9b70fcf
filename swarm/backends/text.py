"""Text handling every engine shares: loading a model folder's tokenizer, rendering chat prompts,
stop strings and request checks. Torch-free, so the vLLM engine (whose model lives in another
process) and the torch engine use the very same rules and cannot drift apart.

Stop strings act on ids through the tokenizer's decode: ids are cut before the token in which the
stop string begins, so the returned ids decode to exactly the returned text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarm.backends.base import SamplingParams

__all__ = ["decode", "encode", "find_stop", "load_tokenizer", "render_chat", "safe_prefix_chars", "validate_requests"]

# Folders whose tokenizer_config names the generic fast class are loaded from tokenizer.json as is.
# AutoTokenizer would otherwise swap in the model type's own class (for qwen2: an NFC-normalising,
# regex-splitting tokenizer), which breaks the tiny preset's exact byte round-trip.
_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
_REPLACEMENT = "\ufffd"
MAX_TOP_LOGPROBS = 20


def load_tokenizer(folder: str | Path) -> Any:
    """The folder's tokenizer (offline), by the rule above."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(folder)
    config_file = folder / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in _GENERIC_TOKENIZER_CLASSES and (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def render_chat(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[int]:
    """Apply the chat template with the generation prompt; ``ValueError`` if it cannot render them."""
    from jinja2 import TemplateError

    if not messages:
        raise ValueError("messages must not be empty")
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
    except (TemplateError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"cannot render these messages with the chat template: {exc}") from exc
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """Text of ids as clients see it (special tokens skipped): what stop strings are matched against."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of plain text, no special tokens added (supervised targets)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Earliest index where any stop string occurs in ``text``, or -1."""
    hits = [pos for pos in (text.find(s) for s in stops) if pos >= 0]
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


def validate_requests(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                      max_context: int, vocab_size: int) -> None:
    """``ValueError`` for anything that cannot be served; checked before anything is generated."""
    if len(prompts) != len(params):
        raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")
        if p.max_tokens < 1:
            raise ValueError(f"prompt {i}: max_tokens must be at least 1, got {p.max_tokens}")
        if not (p.temperature >= 0.0 and math.isfinite(p.temperature)):
            raise ValueError(f"prompt {i}: temperature must be a finite number >= 0, got {p.temperature}")
        if not (0.0 < p.top_p <= 1.0):
            raise ValueError(f"prompt {i}: top_p must be in (0, 1], got {p.top_p}")
        if any(s == "" for s in p.stop):
            raise ValueError(f"prompt {i}: stop strings must not be empty")
        if not (0 <= p.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"prompt {i}: top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {p.top_logprobs}")
        if len(prompt) + p.max_tokens > max_context:
            raise ValueError(
                f"prompt {i}: {len(prompt)} prompt tokens + max_tokens {p.max_tokens} exceed the "
                f"model's context of {max_context} tokens"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i}: token ids must lie in [0, {vocab_size})")
