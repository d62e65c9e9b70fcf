"""The Responses API on a real server: the openai SDK's ``client.responses.create`` (plain and
streamed) and an OpenAI Agents SDK agent on its default model, against an episode of the tiny model
taught one tool loop (``taught_tools``). A Responses call is a chat call underneath, so a tool round
trip trains as one sample; what cannot be served is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest
from server_harness import RunningServer
from support import wait_for
from taught_tools import ADD, ANSWER, QUESTION

pytestmark = pytest.mark.slow

# ADD as a Responses function tool (the chat form's function fields at the top level).
ADD_TOOL = {"type": "function", **ADD["function"], "strict": False}
ASK = QUESTION[0]["content"]


@pytest.fixture
def server(tool_model: Path, start_server) -> RunningServer:
    return start_server(model_dir=tool_model, group_size=1, min_group_size=1, batch_groups=1)


def _episode(server: RunningServer) -> tuple[dict, openai.OpenAI]:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "add"}).json()
    return episode, openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)


def _finish_and_train(server: RunningServer, episode: dict) -> dict[str, float]:
    """Finish the episode (a group of one) and return the metrics of the step that trained it."""
    step = server.core.step
    with server.client(episode["api_key"]) as http:
        finished = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": 1.0})
        assert finished.status_code == 200, finished.text
    wait_for(lambda: server.core.step > step, timeout=120)
    return server.core.metrics[-1].metrics


def test_a_tool_round_trip_plain_then_streamed_trains_one_sample(server: RunningServer) -> None:
    episode, llm = _episode(server)
    first = llm.responses.create(model="tiny", input=ASK, tools=[ADD_TOOL], temperature=0.0, max_output_tokens=64)
    assert first.status == "completed" and [i.type for i in first.output] == ["function_call"]
    call = first.output[0]
    assert (call.name, json.loads(call.arguments)) == ("add", {"a": 2, "b": 3}) and call.call_id.startswith("call_")
    assert first.usage.input_tokens == len(first.model_extra["prompt_token_ids"])

    history = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True) for i in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    events = list(llm.responses.create(model="tiny", input=history, tools=[ADD_TOOL], temperature=0.0,
                                       max_output_tokens=32, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == streamed == ANSWER
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.content_part.done", "response.output_item.done"} <= set(kinds)

    trace = server.core.lifecycle.get(episode["episode_id"]).trace
    assert trace.calls == 2 and len(trace.timelines) == 1 and trace.drift_forks == 0 and trace.drift_repaired == 1
    metrics = _finish_and_train(server, episode)
    assert metrics["context/samples_per_episode"] == 1.0 and metrics["context/drift_forks"] == 0


def test_streamed_calls_and_log_probs_match_the_plain_answer(server: RunningServer) -> None:
    llm = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token, max_retries=0)
    asked = {"model": "tiny", "input": ASK, "tools": [ADD_TOOL], "temperature": 0.0, "max_output_tokens": 64}
    plain = llm.responses.create(**asked)
    events = list(llm.responses.create(**asked, stream=True))
    final = events[-1].response
    assert final.model_extra["token_ids"] == plain.model_extra["token_ids"]
    assert [(i.type, i.name, i.arguments) for i in final.output] == [(i.type, i.name, i.arguments) for i in plain.output]
    arguments = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in arguments] == [plain.output[0].arguments]

    worded = llm.responses.create(model="tiny", input="Say hi.", temperature=0.0, max_output_tokens=6,
                                  include=["message.output_text.logprobs"], top_logprobs=2)
    [message] = worded.output
    entries = message.content[0].logprobs
    assert len(entries) == len(worded.model_extra["token_ids"]) and all(len(e.top_logprobs) == 2 for e in entries)
    assert worded.status == "incomplete" and worded.incomplete_details.reason == "max_output_tokens"


def test_what_cannot_be_served_is_a_400_naming_it(server: RunningServer) -> None:
    refusals = {
        "previous_response_id": {"previous_response_id": "resp_1"},
        "store": {"store": True},
        "conversation": {"conversation": "conv_1"},
        "tool_choice": {"tools": [ADD_TOOL], "tool_choice": {"type": "file_search"}},
        "include": {"include": ["file_search_call.results"]},
        "stream_options": {"stream_options": {"include_obfuscation": False}},
        "text": {"text": {"format": {"type": "grammar"}}},
        "truncation": {"truncation": "auto"},
        "input_image": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
        "web_search": {"tools": [{"type": "web_search"}]},
        "item_reference": {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "frobnicate": {"frobnicate": 1},
    }
    with server.client() as http:
        for name, fields in refusals.items():
            answer = http.post("/v1/responses", json={"input": ASK, **fields})
            assert answer.status_code == 400 and name in answer.json()["error"]["message"], (name, answer.text)
        served = http.post("/v1/responses", json={"input": ASK, "store": False, "truncation": "disabled",
                                                  "reasoning": {"effort": "low"}, "metadata": {"k": "v"},
                                                  "max_output_tokens": 2})
        assert served.status_code == 200, served.text


def test_an_agents_sdk_agent_on_its_default_model_trains_one_sample(server: RunningServer) -> None:
    from agents import Agent, FunctionTool, ModelSettings, RunConfig, Runner
    from agents.models.openai_provider import OpenAIProvider

    calls: list[dict] = []

    async def add(_context, arguments: str) -> str:
        calls.append(json.loads(arguments))
        return str(sum(calls[-1].values()))

    tool = FunctionTool(name="add", description=ADD["function"]["description"],
                        params_json_schema=ADD["function"]["parameters"], on_invoke_tool=add, strict_json_schema=False)
    agent = Agent(name="adder", tools=[tool], model="tiny",
                  model_settings=ModelSettings(temperature=0.0, max_tokens=48))
    for streamed in (False, True):
        episode, _ = _episode(server)
        client = openai.AsyncOpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
        if streamed:
            async def run_streamed() -> str:
                result = Runner.run_streamed(agent, ASK, run_config=config, max_turns=4)
                async for _ in result.stream_events():
                    pass
                return str(result.final_output)

            output = asyncio.run(run_streamed())
        else:
            output = str(Runner.run_sync(agent, ASK, run_config=config, max_turns=4).final_output)
        assert output == ANSWER and calls[-1] == {"a": 2, "b": 3}
        trace = server.core.lifecycle.get(episode["episode_id"]).trace
        assert trace.calls == 2 and len(trace.timelines) == 1 and trace.drift_forks == 0
        metrics = _finish_and_train(server, episode)
        assert metrics["context/samples_per_episode"] == 1.0 and metrics["context/drift_forks"] == 0


def test_an_unknown_route_names_the_served_ones(server: RunningServer) -> None:
    llm = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token, max_retries=0)
    with pytest.raises(openai.NotFoundError) as legacy:
        llm.completions.create(model="tiny", prompt="2 + 3 =", max_tokens=4)
    message = legacy.value.body["message"]
    assert "legacy" in message and "POST /v1/chat/completions" in message and "POST /v1/responses" in message
    with server.client() as http:
        other = http.post("/v1/embeddings", json={"input": "x"}).json()["error"]
    assert other["code"] == "not_found" and "GET /v1/models" in other["message"] and "/api/v1" in other["message"]
