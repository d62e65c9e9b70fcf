"""What agent frameworks meet unchanged (issue 62): model names, defaults and refusals, with the openai SDK.

One server on the tiny model with ``--served-model-name gpt-4o-mini,policy`` and a 256-token context
(so "the rest of the context" is quick to generate), plus one without served names for the earlier
any-name contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_harness import RunningServer, launch
from typer.testing import CliRunner

from swarm.cli import app

MESSAGES = [{"role": "user", "content": "Spell abc."}]
QUESTION = [{"role": "user", "content": "2+3?"}]
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}  # short: the context is small
CONTEXT = 512


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory) -> Iterator[RunningServer]:
    running = launch(tiny_model, tmp_path_factory.mktemp("agent-defaults"), max_context=CONTEXT, group_size=1,
                     min_group_size=1, batch_groups=1000, served_model_name=["gpt-4o-mini", "policy"])
    yield running
    running.stop()


def _llm(server: RunningServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or server.token, max_retries=0)


def _claim(server: RunningServer, task: str = "t") -> dict[str, Any]:
    with server.client() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _patch(server: RunningServer, **values: Any) -> None:
    with server.client() as http:
        assert http.patch("/api/v1/config", json={"values": values}).status_code == 200


def test_answers_echo_the_requested_name_and_only_served_names_are_served(server: RunningServer) -> None:
    llm = _llm(server)
    listed = llm.models.list().data
    assert [m.id for m in listed] == ["gpt-4o-mini", "policy"]
    assert listed[0].model_extra is not None and listed[0].model_extra["max_model_len"] == CONTEXT
    for name in ("gpt-4o-mini", "policy"):
        assert llm.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2).model == name
    chunks = list(llm.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=2, stream=True))
    assert {c.model for c in chunks} == {"policy"}
    assert llm.responses.create(model="gpt-4o-mini", input="hi", max_output_tokens=2).model == "gpt-4o-mini"
    with pytest.raises(openai.NotFoundError, match="does not exist") as missing:
        llm.chat.completions.create(model="gpt-5", messages=MESSAGES, max_tokens=2)
    assert missing.value.body["detail"]["served"] == ["gpt-4o-mini", "policy"]  # type: ignore[index]  # the SDK unwraps "error"
    with pytest.raises(openai.NotFoundError):
        llm.responses.create(model="gpt-5", input="hi", max_output_tokens=2)
    with httpx.Client(base_url=server.url) as anon:  # no key: 401 before any name is checked
        assert anon.post("/v1/chat/completions", json={"model": "gpt-5", "messages": MESSAGES}).status_code == 401


def test_without_served_names_any_name_is_served_and_echoed(start_server) -> None:
    plain = start_server(max_context=CONTEXT)
    llm = _llm(plain)
    assert [m.id for m in llm.models.list().data] == [plain.core.generator.model_name]
    assert llm.chat.completions.create(model="anything", messages=MESSAGES, max_tokens=2).model == "anything"
    with plain.client() as http:  # a request that names none gets the model's own name
        assert http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}).json()["model"] \
            == plain.core.generator.model_name


def test_a_call_without_max_tokens_gets_the_rest_of_the_context(server: RunningServer) -> None:
    with server.client() as http:
        def ask() -> dict[str, Any]:
            response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "ignore_eos": True})
            assert response.status_code == 200, response.text
            return dict(response.json())

        whole = ask()
        assert whole["usage"]["completion_tokens"] == CONTEXT - whole["usage"]["prompt_tokens"]
        assert whole["choices"][0]["finish_reason"] == "length"
        _patch(server, max_tokens=5)  # the config key, where a study sets its completion length
        try:
            assert ask()["usage"]["completion_tokens"] == 5
        finally:
            _patch(server, max_tokens=None)


def test_pin_holds_training_calls_at_the_training_values_and_says_so(server: RunningServer) -> None:
    def sample(key: str, temperature: float) -> list[int]:
        reply = _llm(server, key).chat.completions.create(model="policy", messages=MESSAGES, max_tokens=12, seed=7,
                                                          temperature=temperature)
        return list((reply.choices[0].model_extra or {})["token_ids"])  # vLLM's extra field

    greedy, at_one = sample(server.token, 0.0), sample(server.token, 1.0)  # control token: always honoured
    assert greedy != at_one
    before = server.status()["client_sampling"]
    honoured = _claim(server, "honour")
    assert sample(honoured["api_key"], 0.0) == greedy  # honor (the default): sampled as the client asked
    assert server.status()["client_sampling"]["honoured"] == before["honoured"] + 1
    _patch(server, client_sampling="pin")
    try:
        pinned = _claim(server, "pin")
        assert sample(pinned["api_key"], 0.0) == at_one  # held at the config's temperature 1.0 and top_p 1.0
        status = server.status()["client_sampling"]
        assert status["overridden"] == before["overridden"] + 1
        trace = server.core.lifecycle.get(pinned["episode_id"]).trace
        assert trace.sampling_overridden == 1 and trace.timelines[0].temperature == 1.0
        assert sample(pinned["api_key"], 1.0) == at_one  # asking for the training values is no override
        assert server.status()["client_sampling"]["overridden"] == status["overridden"]
    finally:
        _patch(server, client_sampling="honor")


def test_unsupported_options_are_400s_naming_the_field(server: RunningServer) -> None:
    llm = _llm(server)
    refused = {"response_format": {"type": "grammar"},
               "tool_choice": {"type": "function", "function": {"name": "nope"}},
               "function_call": {"name": "nope"},
               "top_logprobs": 21}
    for field, value in refused.items():
        extra = {"tools": [ADD]} if field == "tool_choice" else {"functions": [ADD["function"]]} \
            if field == "function_call" else {"logprobs": True} if field == "top_logprobs" else {}
        with pytest.raises(openai.BadRequestError) as error:
            llm.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=2,
                                        extra_body={field: value, **extra})
        body = error.value.body
        assert isinstance(body, dict) and set(body) == {"code", "message", "detail", "retry_after"}
        assert body["code"] == "bad_request" and field in body["message"], body
    schema = {"type": "json_schema", "json_schema": {"name": "x"}}  # no schema
    with pytest.raises(openai.BadRequestError, match="response_format"):
        llm.chat.completions.create(model="policy", messages=MESSAGES, response_format=schema)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="text"):
        llm.responses.create(model="policy", input="hi", text={"format": {"type": "json_schema", "name": "x"}})


def test_legacy_functions_are_read_as_tools(server: RunningServer) -> None:
    call = {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    legacy = [*QUESTION, {"role": "assistant", "content": None, "function_call": call},
              {"role": "function", "name": "add", "content": "5"}]
    current = [*QUESTION, {"role": "assistant", "content": None,
                           "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
               {"role": "tool", "name": "add", "tool_call_id": "call_1", "content": "5"}]
    with server.client() as http:
        def prompt(**body: Any) -> list[int]:
            response = http.post("/v1/chat/completions", json={"max_tokens": 1, **body})
            assert response.status_code == 200, response.text
            return list(response.json()["prompt_token_ids"])

        assert prompt(messages=QUESTION, functions=[ADD["function"]], function_call="auto") \
            == prompt(messages=QUESTION, tools=[ADD], tool_choice="auto") != prompt(messages=QUESTION)
        assert prompt(messages=legacy, functions=[ADD["function"]]) == prompt(messages=current, tools=[ADD])
        both = http.post("/v1/chat/completions", json={"messages": QUESTION, "tools": [ADD],
                                                       "functions": [ADD["function"]]})
        assert both.status_code == 400 and "functions" in both.json()["error"]["message"]


def test_served_model_name_flag_is_checked() -> None:
    empty = CliRunner().invoke(app, ["serve", "--check", "--served-model-name", " , "])
    assert empty.exit_code == 2 and "served-model-name" in empty.output
    assert CliRunner().invoke(app, ["serve", "--check", "--served-model-name", "gpt-4o-mini,policy"]).exit_code == 0
