"""Acceptance: an unchanged LangGraph ReAct agent (``create_react_agent`` + ``ChatOpenAI`` with two
Python tools) runs its loop through an episode of a warmed-up ``tiny-bpe`` server: it calls a tool
(the Python function runs), the result goes back into the model, the agent finishes, and the episode
trains as one sample with no drift fork."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_harness import RunningServer, launch
from support import wait_for

pytestmark = pytest.mark.slow

QUESTION = "What is 2 + 3?"
ANSWER = "2 + 3 = 5."


def _tools(calls: list[tuple[str, int, int]]) -> list:
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(("add", a, b))
        return a + b

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        calls.append(("multiply", a, b))
        return a * b

    return [add, multiply]


@pytest.fixture(scope="module")
def agent_model(bpe_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny-bpe`` taught the agent's loop on the exact tool JSON LangChain sends."""
    from langchain_core.utils.function_calling import convert_to_openai_tool

    tools = [convert_to_openai_tool(t) for t in _tools([])]
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    user = {"role": "user", "content": QUESTION}
    examples = [
        {"messages": [user], "tools": tools,
         "completion": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'},
        {"messages": [user, {"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_0", "content": "5"}], "tools": tools,
         "completion": ANSWER},
    ]
    server = launch(bpe_model, tmp_path_factory.mktemp("warm-agent"))
    try:
        with server.client() as http:
            sft = http.post("/api/v1/control/sft", json={"examples": examples, "steps": 120, "batch_size": 2,
                                                         "lr": 3e-3})
            assert sft.status_code == 200, sft.text
            assert sft.json()["loss_last"] < 0.05, sft.json()
            return Path(http.post("/api/v1/control/checkpoint").json()["detail"]["weights"])
    finally:
        server.stop()


def test_a_langgraph_react_agent_runs_its_tool_loop_as_one_sample(agent_model: Path, start_server) -> None:
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    server: RunningServer = start_server(model_dir=agent_model, group_size=1, min_group_size=1, batch_groups=1)
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "react"}).json()
    calls: list[tuple[str, int, int]] = []
    llm = ChatOpenAI(base_url=episode["base_url"], api_key=episode["api_key"], model="tiny-bpe", temperature=0,
                     max_tokens=48, max_retries=0)
    agent = create_react_agent(llm, _tools(calls))
    result = agent.invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 8})

    assert calls == [("add", 2, 3)], "the agent never ran the tool"
    kinds = [m.type for m in result["messages"]]
    assert kinds == ["human", "ai", "tool", "ai"], kinds
    assert result["messages"][2].content == "5" and result["messages"][-1].content == ANSWER
    trace = server.core.lifecycle.get(episode["episode_id"]).trace
    assert trace.calls == 2 and trace.tool_calls == 1

    with server.client(episode["api_key"]) as http:
        finished = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": 1.0})
        assert finished.status_code == 200, finished.text
    wait_for(lambda: server.core.step >= 1, timeout=120)
    metrics = server.core.metrics[-1].metrics
    assert metrics["context/samples_per_episode"] == 1.0 and metrics["context/drift_forks"] == 0
    print(json.dumps({k: metrics[k] for k in ("context/drift_repaired", "rollout/tool_calls")}))
