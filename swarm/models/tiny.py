"""The ``tiny`` preset: a small Qwen2-style model and a byte-level tokenizer, built offline.

Everything in the project must run on a fresh CPU machine with no downloads, so the default model
is generated here: random weights from a seed and a tokenizer in which every byte 0-255 is one
token (any text round-trips). The result is an ordinary Hugging Face folder that
``AutoTokenizer``/``AutoModelForCausalLM`` load like any other, so the backend has one loading path.

The tokenizer is made with the ``tokenizers`` library (a BPE model with the 256-byte alphabet and no
merges). ``ByT5Tokenizer`` is avoided: with transformers 5.x its decode is slow and a folder saved
with it reloads through ``AutoTokenizer`` as a tokenizer that encodes everything to ``[]``.

The chat template follows Qwen2's layout (``<|im_start|>role ... <|im_end|>``, tools in the system
prompt, ``<tool_call>{json}</tool_call>`` for calls, tool results as ``<tool_response>`` blocks) and
is append-only for plain assistant turns: a conversation with a new assistant message renders as the
previous generation prompt + the message's tokens + ``<|im_end|>``, which is what lets the server
merge multi-turn calls into one token timeline.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.models.named import TINY_MARKER
from swarm.text.templates import byte_level_alphabet

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TINY_FORMAT", "TINY_SHAPE", "build_tiny", "is_current_tiny"]

# Bumped whenever the preset's files change, so cached folders from an older build are rebuilt.
TINY_FORMAT = 1

# Byte tokens take ids 0-255; special tokens follow; the embedding is padded to 384 rows.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Kept as normal (non-special) added tokens so they survive ``skip_special_tokens`` decoding and
# the server can parse tool calls out of the returned text, as with Qwen's own tokenizer.
TOOL_TOKENS = ("<tool_call>", "</tool_call>")
TINY_SHAPE = {
    "vocab_size": 384,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 352,
    "max_position_embeddings": 2048,
}

CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
    {%- if content is string -%}{{ content }}
    {%- elif content is iterable -%}
        {%- for part in content -%}{%- if part.text is defined -%}{{ part.text }}{%- endif -%}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set first_system = messages|length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if first_system -%}{{- text(messages[0].content) -}}{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}
    {{- '\n\n# Tools\n\nYou may call one or more functions. Function signatures are inside <tools></tools>:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each call, answer with a JSON object inside <tool_call></tool_call> tags:\n' -}}
    {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_system -%}
    {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if loop.first and first_system -%}
    {%- elif message.role == 'user' or message.role == 'system' -%}
        {{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + text(message.content) -}}
        {%- for call in (message.tool_calls or []) -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if message.content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def _build_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in enumerate(byte_level_alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=TINY_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def build_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer to ``directory`` (a Hugging Face folder) and return it.

    Weights are drawn from ``seed`` without touching the global torch RNG, so the same seed always
    gives the same folder contents.
    """
    marker: dict[str, object] = {"preset": "tiny", "format": TINY_FORMAT, "seed": seed, **TINY_SHAPE}
    return write_qwen2_folder(directory, _build_tokenizer(), TINY_SHAPE, seed, TINY_MARKER, marker)


def write_qwen2_folder(directory: str | Path, tokenizer: PreTrainedTokenizerFast, shape: dict[str, int], seed: int,
                       marker_file: str, marker: dict[str, object]) -> Path:
    """A random Qwen2 model of ``shape`` (tied embeddings, ChatML ends of turn) with ``tokenizer``,
    saved as a Hugging Face folder; ``marker`` goes to ``marker_file`` last, so a folder with a marker
    is complete. Every preset is built this way."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if len(tokenizer) > shape["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary")
    config = Qwen2Config(**shape, tie_word_embeddings=True, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad,
                         rope_theta=10000.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=pad)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / marker_file).write_text(json.dumps(marker, indent=2))
    logger.info("built %s model (seed %d) in %s", marker["preset"], seed, target)
    return target


def is_current_tiny(directory: str | Path, seed: int) -> bool:
    """True if ``directory`` holds a complete tiny build of this format and seed."""
    marker = Path(directory) / TINY_MARKER
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    complete = all((Path(directory) / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))
    return complete and info.get("format") == TINY_FORMAT and info.get("seed") == seed
