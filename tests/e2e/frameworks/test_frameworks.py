"""Seven agent frameworks (``.venv-frameworks``, ``.ci/setup-frameworks``), each an agent with one tool,
unchanged but for ``base_url``, ``api_key`` and the model name, against one ``swarm serve --model tiny
--served-model-name gpt-4o-mini`` through a run key: every call is answered 200, and the episodes the
calls opened finish and train (``agent_run``). The model is untrained, so an agent that lets the model
choose rarely gets a call that parses and ends on its first reply; pydantic-ai's structured output
forces calls (``tool_choice: "required"``), served by constrained decoding, so its loop runs the tool.
The agents' code is in ``agents/``; tiny's 2,048-byte context fits their conversations."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_run import assert_served_and_trained, needs_frameworks, run_agent
from support import ServeProcess

from swarm.client import SwarmClient

pytestmark = [pytest.mark.slow, needs_frameworks]


def test_pydantic_ai_text_and_structured_output(tiny_server: ServeProcess, tmp_path: Path) -> None:
    """Plain text, then ``output_type`` a pydantic model: its calls parse until the output tool, which validates."""
    run = run_agent(tiny_server, "pydantic_ai", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None and run.result is not None, run.error
    assert isinstance(run.result["structured"]["total"], int), run.result
    assert run.result["structured_calls"] == len(run.result["add_runs"]) + 1  # each add call, then the output


def test_llama_index_function_agent(tiny_server: ServeProcess, tmp_path: Path) -> None:
    """``llama_index.llms.openai.OpenAI`` checks the model name (``gpt-4o-mini`` is served) and sends
    ``temperature: 0.1``, which ``client_sampling = "pin"`` holds at the training temperature."""
    with SwarmClient(tiny_server.url, token=tiny_server.token) as control:
        control.patch_config(client_sampling="pin")
        try:
            run = run_agent(tiny_server, "llama_index", tmp_path)
        finally:
            control.patch_config(client_sampling="honor")
    assert_served_and_trained(run, tiny_server)
    assert run.error is None, run.error
    assert run.after is not None
    pinned = run.after.client_sampling.overridden - run.before.client_sampling.overridden
    assert pinned == len(run.calls), run.after.client_sampling


def test_autogen_assistant_agent(tiny_server: ServeProcess, tmp_path: Path) -> None:
    """``OpenAIChatCompletionClient`` needs a model name from its table of OpenAI's (``gpt-4o-mini``)."""
    run = run_agent(tiny_server, "autogen", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None and run.result is not None, run.error
    assert run.result["messages"][0] == "TextMessage" and len(run.result["messages"]) >= 2, run.result


def test_strands_agent(tiny_server: ServeProcess, tmp_path: Path) -> None:
    """It streams and sends no ``max_tokens``: the reply gets the rest of the context and ends by itself,
    not at a length limit (``MaxTokensReachedException``)."""
    run = run_agent(tiny_server, "strands", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None and run.result is not None, run.error
    assert run.result["stop_reason"] in ("end_turn", "tool_use"), run.result


def test_crewai_crew(tiny_server: ServeProcess, tmp_path: Path) -> None:
    run = run_agent(tiny_server, "crewai", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None, run.error


def test_agno_agent(tiny_server: ServeProcess, tmp_path: Path) -> None:
    """agno reports a failed model call in the run's status rather than raising: it must say completed."""
    run = run_agent(tiny_server, "agno", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None and run.result is not None, run.error
    assert run.result["status"] == "COMPLETED", run.result


def test_haystack_agent(tiny_server: ServeProcess, tmp_path: Path) -> None:
    run = run_agent(tiny_server, "haystack", tmp_path)
    assert_served_and_trained(run, tiny_server)
    assert run.error is None, run.error
