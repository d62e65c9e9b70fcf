"""The tiny-bpe presets: Qwen's real BPE tokenizer, Qwen2.5/Qwen3-style templates, a tiny Qwen2 model.

Each preset is built once per module through ``resolve_model_folder`` (the path servers use).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend
from swarm.models.presets import PRESETS, is_preset
from swarm.models.resolve import resolve_model_folder
from swarm.models.tiny_bpe import ADDED_TOKENS, is_current_tiny_bpe
from swarm.text.templates import load_tokenizer

TOOLS = [{
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOL_LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "assistant", "content": "It is 5, naïvely. 🐝"},
]
REPLY_TEXT = {2: CALL, 4: "It is 5, naïvely. 🐝"}  # what the model generated for each assistant turn


@pytest.fixture(scope="module")
def bpe_dir(bpe_model: Path) -> Path:
    return bpe_model  # built once per session (tests/conftest.py)


@pytest.fixture(scope="module")
def tok(bpe_dir: Path) -> Any:
    return load_tokenizer(bpe_dir)


@pytest.fixture(scope="module")
def think(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = resolve_model_folder("tiny-bpe-think", seed=0,
                                  cache_dir=tmp_path_factory.mktemp("models") / "tiny-bpe-think-0")
    return load_tokenizer(folder)


def render(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_presets_are_listed_and_the_folder_is_marked(bpe_dir: Path, tmp_path: Path) -> None:
    assert PRESETS == ("tiny", "tiny-bpe", "tiny-bpe-think")
    assert is_preset("tiny-bpe") and not is_preset(str(bpe_dir))
    assert is_current_tiny_bpe(bpe_dir, "tiny-bpe", 0) and not is_current_tiny_bpe(bpe_dir, "tiny-bpe-think", 0)
    assert not is_current_tiny_bpe(bpe_dir, "tiny-bpe", 1)
    # A build of an older format is stale (resolve_model_folder rebuilds it).
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (tmp_path / name).touch()
    marker = json.loads((bpe_dir / "tiny_bpe.json").read_text())
    (tmp_path / "tiny_bpe.json").write_text(json.dumps({**marker, "format": marker["format"] - 1}))
    assert not is_current_tiny_bpe(tmp_path, "tiny-bpe", 0)
    config = json.loads((bpe_dir / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (151936, 64, 2)
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 4096
    assert json.loads((bpe_dir / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]


def test_added_tokens_have_qwens_ids(tok: Any) -> None:
    fixed = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
             "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
             "<think>": 151667, "</think>": 151668}
    assert {t: tok.convert_tokens_to_ids(t) for t in fixed} == fixed
    assert [tok.convert_tokens_to_ids(content) for _, content, _ in ADDED_TOKENS] == list(range(151643, 151669))
    assert len(tok) == 151669
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
    ids = tok.encode("<|im_start|>hi<tool_call>{}</tool_call><think>x</think><|im_end|>", add_special_tokens=False)
    assert ids[0] == 151644 and ids[-1] == 151645 and 151657 in ids and 151667 in ids
    # Special ones vanish from decoded text; tool-call and think tags stay so they can be parsed.
    assert tok.decode(ids, skip_special_tokens=True) == "hi<tool_call>{}</tool_call><think>x</think>"


@pytest.mark.parametrize("text", [
    "Hello world", "naïve café, 日本語 🐝 emoji", "tabs\tand\nnewlines\r\n  indented", "١٢٣ 12345 ≠ ∑", "\x00\x7f",
])
def test_text_round_trips(tok: Any, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) <= len(text.encode())


def test_real_qwen_ids_nfc_and_split_survive_the_saved_folder(tok: Any, bpe_dir: Path) -> None:
    from transformers import AutoTokenizer

    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]  # Qwen2.5's own ids
    assert tok.encode("2024", add_special_tokens=False) == [17, 15, 17, 19]  # Qwen splits single digits
    assert tok.decode(tok.encode("e\u0301", add_special_tokens=False)) == "\u00e9"  # NFC normaliser
    auto = AutoTokenizer.from_pretrained(bpe_dir, local_files_only=True)  # transformers' Qwen2Tokenizer
    for text in ("Hello world", "naïve e\u0301 日本語 🐝", "<|im_start|>x<tool_call>\n{}\n</tool_call>", "a  \n\n b"):
        assert auto.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)


def test_a_text_has_non_canonical_encodings(tok: Any) -> None:
    pieces = [tok.convert_tokens_to_ids("Hel"), tok.convert_tokens_to_ids("lo")]
    assert tok.decode(pieces) == "Hello"
    assert tok.encode("Hello", add_special_tokens=False) == [9707] != pieces
    chars = tok.convert_tokens_to_ids(list("Hello"))
    assert tok.decode(chars) == "Hello" and len(set(chars)) == 4


def test_template_renders_tools_calls_and_results_like_qwen25(tok: Any) -> None:
    messages = [*TOOL_LOOP[:3], {"role": "assistant", "content": "Twice:", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},
        {"id": "c3", "type": "function", "function": {"name": "add", "arguments": {"a": 0, "b": 0}}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "2"}, {"role": "tool", "tool_call_id": "c3", "content": "0"}]
    text = render(tok, messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert "\n<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>\n" in text
    assert "<|im_start|>assistant\n" + CALL + "<|im_end|>\n" in text  # no content: call on the first line
    assert ("<|im_start|>assistant\nTwice:\n<tool_call>\n"
            '{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>\n<tool_call>\n'
            '{"name": "add", "arguments": {"a": 0, "b": 0}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n0\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")  # results grouped in one turn
    plain = render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert plain == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_is_append_only_for_a_tool_loop(tok: Any, tools: list | None) -> None:
    for turn, reply in REPLY_TEXT.items():
        prompt = render(tok, TOOL_LOOP[:turn], tools=tools, add_generation_prompt=True)
        full = render(tok, TOOL_LOOP[: turn + 1], tools=tools)
        assert full == prompt + reply + "<|im_end|>\n"
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        assert tok.encode(full, add_special_tokens=False)[: len(prompt_ids)] == prompt_ids


def test_think_template_drops_earlier_reasoning_and_honours_enable_thinking(think: Any) -> None:
    first = [{"role": "user", "content": "q1"},
             {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"}]
    assert render(think, first).endswith("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nA1<|im_end|>\n")
    later = render(think, [*first, {"role": "user", "content": "q2"}], add_generation_prompt=True)
    assert "<|im_start|>assistant\nA1<|im_end|>\n" in later and "hmm" not in later  # not append-only
    assert later.endswith("<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n")
    off = render(think, first[:1], add_generation_prompt=True, enable_thinking=False)
    assert off == "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    # Reasoning given apart is rendered for turns after the last user query, tool loops included.
    loop = [TOOL_LOOP[1], {**TOOL_LOOP[2], "reasoning_content": "use add"}, TOOL_LOOP[3],
            {"role": "assistant", "content": "5", "reasoning_content": "done"}]
    text = render(think, loop, tools=TOOLS)
    assert "<|im_start|>assistant\n<think>\nuse add\n</think>\n\n" + CALL + "<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\ndone\n</think>\n\n5<|im_end|>\n")


def test_backend_generates_and_trains_on_the_preset(bpe_dir: Path) -> None:
    backend = TorchBackend.from_model("tiny-bpe", TrainConfig(lr=1e-3), seed=0, cache_dir=bpe_dir)
    assert backend.model_name == "tiny-bpe" and backend.vocab_size == 151669 and backend.max_context == 4096
    prompt = backend.render_prompt([{"role": "user", "content": "Say hi"}], TOOLS)
    [out] = backend.generate([prompt], [SamplingParams(max_tokens=4, seed=1)])
    assert 1 <= len(out.token_ids) <= 4 and all(0 <= t < 151669 for t in out.token_ids)
    tokens = prompt + out.token_ids
    mask = [0] * len(prompt) + [1] * len(out.token_ids)
    sample = TrainSample(tokens=tokens, loss_mask=mask, rollout_logprobs=[0.0] * len(prompt) + out.logprobs,
                         advantage=1.0)
    metrics = backend.train_step([sample], TrainConfig(lr=1e-3))
    assert backend.policy_version == 1 and all(v == v for v in metrics.values())  # finite, not NaN
