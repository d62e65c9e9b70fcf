"""The agent protocol on a real server: tool calls parsed out of replies (plain and streamed),
tool_choice, refused options, sampling extensions, token bytes, and drift repair of a tool loop
(the tiny model is taught one tool loop first: ``taught_tools``).
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from server_harness import RunningServer
from taught_tools import ADD, ANSWER, CALL_TEXT, QUESTION

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tool_model: Path, start_server) -> RunningServer:
    return start_server(model_dir=tool_model, group_size=1, min_group_size=1, batch_groups=1000)


def _episode_llm(server: RunningServer) -> tuple[str, openai.OpenAI]:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "add"}).json()
    return episode["episode_id"], openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"],
                                                max_retries=0)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_a_taught_call_comes_back_as_tool_calls_streamed_or_not(server: RunningServer) -> None:
    _, llm = _episode_llm(server)
    plain = llm.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], temperature=0.0,
                                        max_tokens=64)
    choice = plain.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert _calls(choice.message) == [("add", {"a": 2, "b": 3})]
    assert choice.message.tool_calls[0].id.startswith("call_") and choice.message.tool_calls[0].type == "function"

    chunks = list(llm.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], temperature=0.0,
                                              max_tokens=64, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed: dict[int, dict] = {}
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = streamed.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
    assert content == ""
    assert [(e["name"], json.loads(e["arguments"])) for e in streamed.values()] == _calls(choice.message)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # tool_choice="none": the same prompt and text, never parsed
    raw = llm.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], tool_choice="none",
                                      temperature=0.0, max_tokens=64)
    assert not raw.choices[0].message.tool_calls and raw.choices[0].finish_reason == "stop"
    assert raw.choices[0].message.content == CALL_TEXT


def test_a_tool_loop_merges_into_one_timeline_and_an_edit_forks(server: RunningServer) -> None:
    episode_id, llm = _episode_llm(server)
    first = llm.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], temperature=0.0, max_tokens=64)
    call = first.choices[0].message
    assert _calls(call) == [("add", {"a": 2, "b": 3})]
    resent = {"role": "assistant", "content": call.content,
              "tool_calls": [c.model_dump() for c in call.tool_calls]}  # arguments as the JSON string we sent
    result = {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "5"}
    second = llm.chat.completions.create(model="tiny", messages=[*QUESTION, resent, result], tools=[ADD],
                                         temperature=0.0, max_tokens=32)
    assert second.choices[0].message.content == ANSWER and second.choices[0].finish_reason == "stop"
    trace = server.core.lifecycle.get(episode_id).trace
    # the template re-renders the compact call with spaces: repaired, not forked
    assert len(trace.timelines) == 1 and trace.drift_forks == 0 and trace.drift_repaired == 1
    sampled = first.choices[0].model_extra["token_ids"]
    prompt2 = second.model_extra["prompt_token_ids"]
    assert prompt2[:len(first.model_extra["prompt_token_ids"]) + len(sampled)] == \
        first.model_extra["prompt_token_ids"] + sampled
    assert trace.tool_calls == 1 and trace.tool_parse_errors == 0

    # The agent edits its earlier call (other arguments): the history really changed -> a fork, counted.
    edited = {**resent, "tool_calls": [{**resent["tool_calls"][0],
                                        "function": {"name": "add", "arguments": '{"a": 4, "b": 3}'}}]}
    llm.chat.completions.create(model="tiny", messages=[*QUESTION, edited, result], tools=[ADD],
                                temperature=0.0, max_tokens=8)
    trace = server.core.lifecycle.get(episode_id).trace
    assert len(trace.timelines) == 2 and trace.drift_forks == 1


def test_options_are_honoured_or_refused_by_name(server: RunningServer) -> None:
    with server.client() as http:
        def post(**body):
            return http.post("/v1/chat/completions", json={"messages": QUESTION, **body})

        unknown = post(frobnicate=1)
        assert unknown.status_code == 400 and "frobnicate" in unknown.json()["error"]["message"]
        for fields in ({"tool_choice": "required"}, {"tools": [ADD], "tool_choice": {"type": "function",
                                                                                      "function": {"name": "sub"}}}):
            refused = post(**fields)  # a forced call needs its tool
            assert refused.status_code == 400 and "tool_choice" in refused.json()["error"]["message"], refused.text
        bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
        refused = post(response_format=bad_schema)  # checked (compiled) before anything is generated
        assert refused.status_code == 400 and "response_format" in refused.json()["error"]["message"], refused.text
        assert post(user="u-1", metadata={"k": "v"}, store=False, max_tokens=2).status_code == 200

        long = post(ignore_eos=True, max_tokens=32, temperature=1.0, seed=3).json()
        assert len(long["choices"][0]["token_ids"]) == 32 and long["choices"][0]["finish_reason"] == "length"
        greedy = post(temperature=0.0, max_tokens=16).json()["choices"][0]["token_ids"]
        top1 = post(temperature=1.0, top_k=1, max_tokens=16, seed=9).json()["choices"][0]["token_ids"]
        assert top1 == greedy


def test_logprobs_carry_bytes_and_stream_their_alternatives(server: RunningServer) -> None:
    with server.client() as http:
        body = {"messages": QUESTION, "tools": [ADD], "temperature": 0.0, "max_tokens": 12, "logprobs": True,
                "top_logprobs": 2}
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
        assert all(entry["bytes"] and len(entry["top_logprobs"]) == 2 for entry in whole)
        assert b"".join(bytes(e["bytes"]) for e in whole).decode(errors="replace").startswith("<tool_call>")
        streamed = []
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        streamed += (choice.get("logprobs") or {}).get("content") or []
    assert [(e["bytes"], [a["bytes"] for a in e["top_logprobs"]]) for e in streamed] == \
        [(e["bytes"], [a["bytes"] for a in e["top_logprobs"]]) for e in whole]
