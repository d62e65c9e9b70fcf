"""The tiny preset is an ordinary offline Hugging Face folder with a byte tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.backends.base import TrainConfig
from swarm.backends.torch import TorchBackend
from swarm.models.tiny import build_tiny

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a swarm?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "swarm"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a large group of insects"},
]


def test_folder_loads_with_auto_classes_offline(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == 384 and model.config.hidden_size == 128
    assert model.config.num_hidden_layers == 2 and model.config.num_key_value_heads == 2
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    ids = tokenizer.encode("hello, wörld", add_special_tokens=False)
    assert ids == list("hello, wörld".encode())
    assert tokenizer.decode(ids) == "hello, wörld"


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path, tiny_dir: Path) -> None:
    again = build_tiny(tmp_path / "again", seed=0)
    other = build_tiny(tmp_path / "other", seed=1)
    original = (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == original
    assert (other / "model.safetensors").read_bytes() != original


@pytest.mark.parametrize(
    "text",
    ["plain ascii", "e\u0301 combining (not NFC)", "日本語 🐝 emoji", "tabs\tand\nnewlines\r\n", "\x00\x7f bytes"],
)
def test_every_byte_is_one_token_and_text_round_trips(backend: TorchBackend, text: str) -> None:
    ids = backend.tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))
    assert backend.decode(ids) == text


def test_special_tokens_are_single_ids_and_skipped_in_decode(backend: TorchBackend) -> None:
    tok = backend.tokenizer
    ids = tok.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    assert ids == [tok.convert_tokens_to_ids("<|im_start|>"), 104, 105, tok.convert_tokens_to_ids("<|im_end|>")]
    assert backend.decode(ids) == "hi"
    call = tok.encode("<tool_call>{}</tool_call>", add_special_tokens=False)
    assert len(call) == 4
    assert backend.decode(call) == "<tool_call>{}</tool_call>"  # kept so tool calls can be parsed


def test_chat_template_renders_tools_calls_and_results(backend: TorchBackend) -> None:
    text = backend.decode(backend.render_prompt(TOOL_CONVERSATION, TOOLS))
    assert text.startswith("system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "lookup", "arguments": {"word": "swarm"}}\n</tool_call>' in text
    assert "<tool_response>\na large group of insects\n</tool_response>" in text
    raw = backend.tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert raw.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert raw.count("<|im_start|>") == 5  # system, user, assistant, tool results (as user), prompt


def test_template_is_append_only_for_plain_assistant_turns(backend: TorchBackend) -> None:
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "first question"}]
    for tools in (None, TOOLS):
        prompt = backend.render_prompt(history, tools)
        reply = "an answer with ünïcode"
        later = backend.render_prompt(
            [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": "next"}], tools
        )
        im_end = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
        expected = prompt + list(reply.encode()) + [im_end]
        assert later[: len(expected)] == expected


def test_bad_messages_raise_value_error(backend: TorchBackend) -> None:
    with pytest.raises(ValueError):
        backend.render_prompt([], None)


def test_from_model_rejects_unknown_names_without_downloading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"an existing local folder or a Hugging Face Hub name"):
        TorchBackend.from_model("no-such-model", TrainConfig())
    # offline (tests/conftest.py) a Hub name outside the hub cache names its download instead
    with pytest.raises(ValueError, match=r"hf download no-such-org/no-such-model "):
        TorchBackend.from_model("no-such-org/no-such-model", TrainConfig())
    with pytest.raises(ValueError, match=r"no config\.json"):
        TorchBackend.from_model(str(tmp_path), TrainConfig())


def test_tiny_preset_builds_into_cache_and_reuses_it(tmp_path: Path) -> None:
    cache = tmp_path / "models" / "tiny-3"
    first = TorchBackend.from_model("tiny", TrainConfig(), seed=3, cache_dir=cache)
    assert first.model_name == "tiny" and first.max_context == 2048
    stamp = (cache / "model.safetensors").stat().st_mtime_ns
    TorchBackend.from_model("tiny", TrainConfig(), seed=3, cache_dir=cache)
    assert (cache / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in cache.parent.iterdir() if not p.name.endswith(".lock")] == ["tiny-3"]  # no staging left
    # A cache from an older preset format (or a half-finished one) is rebuilt, not trusted.
    marker = json.loads((cache / "tiny.json").read_text())
    (cache / "tiny.json").write_text(json.dumps({**marker, "format": 0}))
    TorchBackend.from_model("tiny", TrainConfig(), seed=3, cache_dir=cache)
    assert json.loads((cache / "tiny.json").read_text())["format"] == marker["format"]
    assert (cache / "model.safetensors").stat().st_mtime_ns != stamp


def test_load_backend_builds_the_tiny_preset_under_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from swarm.backends import InProcessModel, load_backend

    monkeypatch.chdir(tmp_path)
    backend = load_backend("tiny", TrainConfig(), seed=5)
    assert isinstance(backend, InProcessModel)
    assert (tmp_path / "artifacts" / "models" / "tiny-5" / "config.json").is_file()
    assert backend.policy_version == 0 and backend.model_name == "tiny"
