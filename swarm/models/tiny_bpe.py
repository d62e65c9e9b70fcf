"""The ``tiny-bpe`` presets: a small random Qwen2 model on Qwen's real byte-level BPE vocabulary.

The ``tiny`` preset's byte tokenizer has one encoding per text, so a sampled id sequence always
equals the encoding of its own text. Real models do not work that way: with a BPE vocabulary the
ids a model samples ('Hel', 'lo') are often not the canonical encoding of the text they spell
('Hello'), and a multi-turn conversation that re-sends a reply as text re-tokenises it differently.
These presets reproduce that on a fresh CPU machine, with nothing downloaded:

- ``tiny-bpe``: Qwen2.5's tokenizer (vocabulary, split regex, NFC, added-token ids) and a
  Qwen2.5-style ChatML template with tools, append-only for plain replies and tool loops;
- ``tiny-bpe-think``: the same model and tokenizer with a Qwen3-style thinking template, which drops
  the ``<think>`` block of turns before the last user query (not append-only, as in Qwen3).

The vocabulary is ``dashscope/resources/qwen.tiktoken`` from the pinned ``dashscope`` wheel (the
151,643 BPE ranks Qwen2, 2.5 and 3 share), found without importing ``dashscope`` (its import is slow
and has side effects); Qwen's merge list is recovered from the ranks (about 1.5 s). The added tokens take
Qwen's exact ids (``<|endoftext|>`` 151643 ... ``</think>`` 151668), so id-level tests transfer to
real Qwen checkpoints. The model is Qwen2's shape in miniature (hidden 64, 2 layers) with Qwen2's
padded embedding of 151,936 rows, so almost all of its ~9.8M parameters are the tied embedding.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.models.named import BPE_MARKER
from swarm.models.tiny import write_qwen2_folder

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "ADDED_TOKENS",
    "BPE_FORMAT",
    "BPE_PRESETS",
    "BPE_SHAPE",
    "CHAT_TEMPLATE",
    "QWEN_SPLIT_PATTERN",
    "THINK_CHAT_TEMPLATE",
    "build_tiny_bpe",
    "is_current_tiny_bpe",
    "qwen_vocab_file",
]

# Bumped whenever the presets' files change, so cached folders from an older build are rebuilt.
BPE_FORMAT = 2
MARKER = BPE_MARKER

BPE_SHAPE = {
    "vocab_size": 151936,  # Qwen2's embedding rows: 151,643 ranks + added tokens, padded
    "hidden_size": 64,
    "num_hidden_layers": 2,
    # Head dim 32: vLLM's CPU attention kernels have no head_dim 16 ("Unsupported CPU attention
    # configuration"), so two heads of 32 rather than four of 16.
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 176,
    "max_position_embeddings": 4096,
}

# Qwen2's pre-tokenizer split (single digits, unlike GPT-4's \p{N}{1,3}).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (id, content, special) as in Qwen3's tokenizer_config ``added_tokens_decoder``; 151643-151664 are
# Qwen2.5's list unchanged, 151665-151668 are Qwen3's additions. Non-special tokens survive
# ``skip_special_tokens`` decoding, so tool calls and think blocks stay in the returned text.
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)

# Shared pieces of both templates: text of string or list-of-parts content, the tools block, and one
# assistant tool call. Arguments arrive as dicts (the server parses JSON strings first, as vLLM
# does); a string is emitted as is.
_COMMON = r"""
{%- macro text(content) -%}
    {%- if content is string -%}{{ content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}{%- if part.text is defined -%}{{ part.text }}{%- endif -%}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro tools_block(tools) -%}
    {{- '# Tools\n\nYou can call one or more functions to help with the user query.\n\n' -}}
    {{- 'The function signatures are inside <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, reply with a JSON object holding the function name and ' -}}
    {{- 'arguments inside <tool_call></tool_call> XML tags:\n' -}}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
{%- endmacro -%}
{%- macro tool_call(call) -%}
    {%- set fn = call.function if call.function is defined else call -%}
    {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
    {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
    {{- '}\n</tool_call>' -}}
{%- endmacro -%}
{%- macro tool_result(messages, loop, message) -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endmacro -%}
"""

# Qwen2.5's layout: a system turn always (a default one when none is given), tools appended to it,
# tool calls after the reply text, consecutive tool results grouped in one user turn.
CHAT_TEMPLATE = _COMMON + r"""
{%- set has_system = messages|length > 0 and messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' -}}
{{- text(messages[0].content) if has_system else 'You are a helpful assistant.' -}}
{%- if tools -%}{{- '\n\n' + tools_block(tools) -}}{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in messages -%}
    {%- if loop.first and has_system -%}
    {%- elif message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' and not message.tool_calls -%}
        {{- '<|im_start|>assistant\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content -%}{{- '\n' + text(message.content) -}}{%- endif -%}
        {%- for call in message.tool_calls -%}{{- '\n' + tool_call(call) -}}{%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- tool_result(messages, loop, message) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# Qwen3's layout: no default system turn; an assistant turn after the last real user query carries
# its reasoning as <think>...</think> (always for the final message); earlier turns lose theirs.
# ``enable_thinking=False`` pre-fills an empty think block in the generation prompt.
THINK_CHAT_TEMPLATE = _COMMON + r"""
{%- set has_system = messages|length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
    {{- tools_block(tools) + '<|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=messages|length - 1, searching=true) -%}
{%- for message in messages|reverse -%}
    {%- set said = text(message.content) -%}
    {%- if ns.searching and message.role == 'user'
          and not (said.startswith('<tool_response>') and said.endswith('</tool_response>')) -%}
        {%- set ns.searching = false -%}
        {%- set ns.last_query = messages|length - 1 - loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- set content = text(message.content) -%}
    {%- if loop.first and has_system -%}
    {%- elif message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- '<|im_start|>assistant\n' + content -}}
        {%- endif -%}
        {%- for call in (message.tool_calls or []) -%}
            {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- tool_call(call) -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- tool_result(messages, loop, message) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""

BPE_PRESETS = ("tiny-bpe", "tiny-bpe-think")
_TEMPLATES = {"tiny-bpe": CHAT_TEMPLATE, "tiny-bpe-think": THINK_CHAT_TEMPLATE}


def qwen_vocab_file() -> Path:
    """Path of ``qwen.tiktoken`` inside the installed ``dashscope`` package (not imported)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the tiny-bpe presets need the 'dashscope' package (pip install dashscope==2.0.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise RuntimeError(f"dashscope is installed but has no Qwen vocabulary at {path}")
    return path


def _read_ranks(path: Path) -> dict[bytes, int]:
    """``qwen.tiktoken``: one ``<base64 token> <rank>`` per line, ranks 0..151642 in order."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _last_merge(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two pieces BPE joins last to make ``token``: merge its bytes by rank, lowest first,
    using only tokens ranked below it (tiktoken's rule), until two pieces are left."""
    limit = ranks[token]
    pieces = [token[i:i + 1] for i in range(len(token))]
    while len(pieces) > 2:
        best, best_rank = -1, limit
        for i in range(len(pieces) - 1):
            rank = ranks.get(pieces[i] + pieces[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            raise RuntimeError(f"token {token!r} (rank {limit}) cannot be built from lower-ranked tokens")
        pieces[best:best + 2] = [pieces[best] + pieces[best + 1]]
    return pieces[0], pieces[1]


def _qwen_bpe() -> Tokenizer:
    """Qwen's BPE as in its ``vocab.json`` + ``merges.txt``: one merge per multi-byte token, in rank
    order (151,387 merges), recovered from the ranks. ``TikTokenConverter`` would list every valid
    split instead (294k merges, a 19 MB tokenizer.json that loads twice as slowly)."""
    from tokenizers import Tokenizer, models
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    ranks = _read_ranks(qwen_vocab_file())
    if sorted(ranks.values()) != list(range(ADDED_TOKENS[0][0])):
        raise RuntimeError(f"expected ranks 0..{ADDED_TOKENS[0][0] - 1} in qwen.tiktoken, got {len(ranks)} ranks")
    byte_char = bytes_to_unicode()

    def chars(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    vocab = {chars(token): rank for token, rank in ranks.items()}
    merges = [tuple(map(chars, _last_merge(ranks, token))) for token in ranks if len(token) > 1]
    return Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))


def _build_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = _qwen_bpe()
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    core.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for token_id, content, special in ADDED_TOKENS:  # one at a time: ids follow the ranks in order
        token = AddedToken(content, special=special, normalized=False)
        added = core.add_special_tokens([token]) if special else core.add_tokens([token])
        if added != 1 or core.token_to_id(content) != token_id:
            raise RuntimeError(f"{content} got id {core.token_to_id(content)}, expected {token_id}")
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        model_max_length=BPE_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def build_tiny_bpe(directory: str | Path, preset: str = "tiny-bpe", seed: int = 0) -> Path:
    """Write ``preset`` (one of ``BPE_PRESETS``) to ``directory`` as a Hugging Face folder.

    Weights are drawn from ``seed`` without touching the global torch RNG, so the same seed always
    gives the same weights.
    """
    if preset not in _TEMPLATES:
        raise ValueError(f"unknown preset {preset!r}; expected one of {BPE_PRESETS}")
    marker: dict[str, object] = {"preset": preset, "format": BPE_FORMAT, "seed": seed, **BPE_SHAPE}
    return write_qwen2_folder(directory, _build_tokenizer(_TEMPLATES[preset]), BPE_SHAPE, seed, MARKER, marker)


def is_current_tiny_bpe(directory: str | Path, preset: str, seed: int) -> bool:
    """True if ``directory`` holds a complete build of ``preset`` in this format and seed."""
    folder = Path(directory)
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    complete = all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    return complete and info.get("preset") == preset and info.get("format") == BPE_FORMAT and info.get("seed") == seed
