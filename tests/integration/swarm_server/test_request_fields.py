"""vLLM's and OpenAI's request fields on ``/v1/chat/completions``, on a real server: ``logit_bias``
bans and forces ids, ``continue_final_message`` continues the given assistant text token-exactly,
``reasoning_effort`` reaches the chat template, a streamed tool call sends no empty deltas, and what
cannot be served (image or audio parts, ``stream_options`` without ``stream``, ``top_logprobs``
without ``logprobs``) is a 400 naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from server_harness import RunningServer
from taught_tools import ADD, CALL_MESSAGE, QUESTION, RESULT

from swarm.text.templates import prepare_messages

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tool_model: Path, start_server) -> RunningServer:
    return start_server(model_dir=tool_model, group_size=1, min_group_size=1, batch_groups=1000)


def _post(server: RunningServer, token: str | None = None, **body) -> dict:
    with server.client(token) as http:
        answer = http.post("/v1/chat/completions", json={"messages": QUESTION, "tools": [ADD], **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_logit_bias_bans_and_forces_ids(server: RunningServer) -> None:
    greedy = _post(server, temperature=0.0, max_tokens=4)["choices"][0]["token_ids"]
    first = greedy[0]
    banned = _post(server, temperature=1.0, n=8, seed=5, max_tokens=4, logit_bias={str(first): -100})
    assert all(first not in choice["token_ids"] for choice in banned["choices"])
    assert _post(server, temperature=0.0, max_tokens=4, logit_bias={str(first): -100})["choices"][0]["token_ids"][0] \
        != first
    forced = _post(server, temperature=0.0, max_tokens=3, logit_bias={"65": 100})["choices"][0]["token_ids"]
    assert forced == [65, 65, 65]


def test_continue_final_message_continues_the_given_text_token_exactly(server: RunningServer) -> None:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "continue"}).json()
    started = {"role": "assistant", "content": "It is"}
    messages = [*QUESTION, CALL_MESSAGE, RESULT, started]
    reply = _post(server, episode["api_key"], messages=messages, temperature=0.0, max_tokens=8,
                  add_generation_prompt=False, continue_final_message=True)
    assert reply["choices"][0]["message"]["content"] == " 5."  # the taught answer, "It is 5.", goes on
    text = server.core.generator.text
    rendered = text.tokenizer.apply_chat_template(prepare_messages(messages), tools=[ADD],
                                                  continue_final_message=True, tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\nIt is")
    assert reply["prompt_token_ids"] == text.encode(rendered)
    [timeline] = server.core.lifecycle.get(episode["episode_id"]).trace.timelines
    assert timeline.tokens == reply["prompt_token_ids"] + reply["choices"][0]["token_ids"]


def test_reasoning_effort_reaches_the_chat_template(tool_model: Path, tmp_path: Path, start_server) -> None:
    model = shutil.copytree(tool_model, tmp_path / "model")
    template = model / "chat_template.jinja"
    template.write_text("{%- if reasoning_effort is defined -%}effort={{ reasoning_effort }};{%- endif -%}"
                        + template.read_text())
    server = start_server(model_dir=model)
    text = server.core.generator.text
    plain = _post(server, max_tokens=1)["prompt_token_ids"]
    low = _post(server, max_tokens=1, reasoning_effort="low")["prompt_token_ids"]
    assert text.decode(low).startswith("effort=low;") and not text.decode(plain).startswith("effort")
    # vLLM's precedence: chat_template_kwargs over the field
    high = _post(server, max_tokens=1, reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"})
    assert text.decode(high["prompt_token_ids"]).startswith("effort=high;")


def test_a_streamed_tool_call_sends_no_empty_deltas(server: RunningServer) -> None:
    plain = _post(server, temperature=0.0, max_tokens=64)["choices"][0]
    with server.client() as http, http.stream("POST", "/v1/chat/completions", json={
            "messages": QUESTION, "tools": [ADD], "temperature": 0.0, "max_tokens": 64, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    choices = [c["choices"][0] for c in chunks]
    assert all(c["delta"] for c in choices[:-1]), [c["delta"] for c in choices]
    assert [t for c in choices for t in c.get("token_ids", [])] == plain["token_ids"]
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_fields_that_cannot_be_served_are_400s_naming_them(server: RunningServer) -> None:
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]
    refusals = {
        "image_url": {"messages": image},
        "input_audio": {"messages": audio},
        "stream_options": {"stream_options": {"include_usage": True}},
        "top_logprobs": {"top_logprobs": 2},
        "continue_final_message": {"continue_final_message": True},
        "logit_bias": {"logit_bias": {"99999999": -100}},
    }
    with server.client() as http:
        for name, fields in refusals.items():
            answer = http.post("/v1/chat/completions", json={"messages": QUESTION, "max_tokens": 2, **fields})
            assert answer.status_code == 400 and name in answer.json()["error"]["message"], (name, answer.text)
        text_parts = [{"role": "user", "content": [{"type": "text", "text": "What is 2 + 3?"}]}]
        assert http.post("/v1/chat/completions", json={"messages": text_parts, "max_tokens": 2}).status_code == 200
