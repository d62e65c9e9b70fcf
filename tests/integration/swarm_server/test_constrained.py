"""Constrained decoding on a real server (issue 62): forced tool calls (named and ``required``),
``response_format`` json_schema/json_object and the Responses API's ``text.format``, in the request
shapes agent frameworks send (instructor's ``Mode.TOOLS``/``Mode.JSON_SCHEMA``, smolagents' and
pydantic-ai's ``required``); the tiny model taught one tool loop (``taught_tools``) runs it token
exact under the constraint, the trace marks the constrained tokens, and a step trains on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel
from server_harness import RunningServer
from support import wait_for
from taught_tools import ADD, ANSWER, QUESTION

pytestmark = pytest.mark.slow

POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "ok": {"type": "boolean"}},
         "required": ["x", "ok"], "additionalProperties": False}


class Point(BaseModel):
    x: int
    ok: bool


@pytest.fixture
def server(tool_model: Path, start_server) -> RunningServer:
    return start_server(model_dir=tool_model, group_size=2, min_group_size=2, batch_groups=1)


def _episode(server: RunningServer, task: str = "add") -> tuple[str, openai.OpenAI]:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": task}).json()
    return episode["episode_id"], openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"],
                                                max_retries=0)


def test_a_forced_tool_loop_runs_token_exact_and_trains(server: RunningServer) -> None:
    episode_id, llm = _episode(server)
    named = {"type": "function", "function": {"name": "add"}}  # instructor's Mode.TOOLS
    first = llm.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], tool_choice=named,
                                        temperature=0.0, max_tokens=64)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    resent = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    result = {"role": "tool", "tool_call_id": call.id, "content": "5"}
    second = llm.chat.completions.create(model="tiny", messages=[*QUESTION, resent, result], tools=[ADD],
                                         temperature=0.0, max_tokens=32)
    assert second.choices[0].message.content == ANSWER

    # One timeline, token exact: the second prompt continues the first call's prompt and sampled ids.
    trace = server.core.lifecycle.get(episode_id).trace
    prompt1, sampled = first.model_extra["prompt_token_ids"], choice.model_extra["token_ids"]
    assert second.model_extra["prompt_token_ids"][:len(prompt1) + len(sampled)] == prompt1 + sampled
    [timeline] = trace.timelines
    assert trace.drift_forks == 0 and timeline.tokens[:len(prompt1) + len(sampled)] == prompt1 + sampled
    assert timeline.constrained == [(len(prompt1), len(prompt1) + len(sampled))]  # the forced call only
    assert trace.constrained_tokens == len(sampled) and trace.tool_calls == 1

    other_id, other = _episode(server)  # smolagents / pydantic-ai: "required"
    required = other.chat.completions.create(model="tiny", messages=QUESTION, tools=[ADD], tool_choice="required",
                                             temperature=1.0, seed=1, max_tokens=64)
    assert required.choices[0].finish_reason == "tool_calls"
    assert required.choices[0].message.tool_calls[0].function.name == "add"
    with server.client() as http:
        for done, reward in ((episode_id, 1.0), (other_id, 0.0)):
            assert http.post(f"/api/v1/episodes/{done}/finish", json={"reward": reward}).status_code == 200
        wait_for(lambda: server.status()["step"] == 1)
        [step] = http.get("/api/v1/metrics", params={"since_step": 0}).json()
    metrics = step["metrics"]
    assert metrics["train/episodes"] == 2
    # The masked distribution's log-prob is never below the unmasked one: weights at most 1 (none clipped).
    assert 0.0 < metrics["train/rollout_is_weight_mean"] <= 1.0 + 1e-6


def test_json_schema_and_json_object_come_back_valid(server: RunningServer) -> None:
    _, llm = _episode(server, "json")
    parsed = llm.chat.completions.parse(model="tiny", messages=QUESTION, response_format=Point,  # strict json_schema
                                        temperature=1.0, seed=0, max_tokens=200)
    assert parsed.choices[0].finish_reason == "stop" and isinstance(parsed.choices[0].message.parsed, Point)
    obj = llm.chat.completions.create(model="tiny", messages=QUESTION, response_format={"type": "json_object"},
                                      temperature=1.0, seed=0, max_tokens=400)
    assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_responses_text_format_json_schema(server: RunningServer) -> None:
    _, llm = _episode(server, "responses")
    fmt = {"type": "json_schema", "name": "point", "schema": POINT, "strict": True}
    response = llm.responses.create(model="tiny", input="A point?", text={"format": fmt}, temperature=1.0,
                                    max_output_tokens=200)
    value = json.loads(response.output_text)
    assert set(value) == {"x", "ok"} and isinstance(value["x"], int) and isinstance(value["ok"], bool)
    assert response.text.format.type == "json_schema"
    forced = llm.responses.create(model="tiny", input=QUESTION, tools=[{"type": "function", "name": "add",
                                  "parameters": ADD["function"]["parameters"]}],
                                  tool_choice={"type": "function", "name": "add"}, temperature=0.0,
                                  max_output_tokens=64)
    [item] = [o for o in forced.output if o.type == "function_call"]
    assert item.name == "add" and set(json.loads(item.arguments)) == {"a", "b"}
