"""Three agent frameworks whose conversations outgrow tiny's 2,048-byte context, on one ``swarm serve`` of
tiny with an 8,192-token context (``tiny_8k``) and ``--served-model-name gpt-4o-mini``, each unchanged but
for ``base_url``, ``api_key`` and the model name (``agent_run``): smolagents (a 4,204-byte system
prompt), dspy ReAct (about 2,500 bytes) and instructor (``Mode.JSON`` re-sends each failed reply).
smolagents and instructor's ``Mode.TOOLS`` and ``Mode.JSON_SCHEMA`` force the reply's shape, which the
server serves by constrained decoding: the untrained model's replies parse."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_run import assert_served_and_trained, needs_frameworks, run_agent
from support import ServeProcess

pytestmark = [pytest.mark.slow, needs_frameworks]


def test_instructor_tools_json_schema_and_json(long_server: ServeProcess, tmp_path: Path) -> None:
    """``Mode.TOOLS`` (a named ``tool_choice``) and ``Mode.JSON_SCHEMA`` parse into the response model;
    ``Mode.JSON`` (json_object, the schema only in the prompt) is served and may fail validation."""
    run = run_agent(long_server, "instructor", tmp_path)
    assert_served_and_trained(run, long_server)
    assert run.error is None and run.result is not None, run.error
    assert isinstance(run.result["TOOLS"]["total"], int), run.result
    assert isinstance(run.result["JSON_SCHEMA"]["total"], int), run.result
    json_mode = run.result["JSON"]
    assert "total" in json_mode or json_mode["cause"] in ("ValidationError", "IncompleteOutputException"), json_mode


def test_smolagents_tool_calling_agent(long_server: ServeProcess, tmp_path: Path) -> None:
    """``tool_choice: "required"`` on every step: each step is a call that parses (``add`` runs the
    function, ``final_answer`` ends the run)."""
    run = run_agent(long_server, "smolagents", tmp_path)
    assert_served_and_trained(run, long_server)
    assert run.error is None and run.result is not None, run.error
    assert run.result["step_errors"] == [], run.result["step_errors"]
    assert len(run.result["tool_calls"]) >= run.result["steps"] >= 1, run.result
    assert len(run.result["add_runs"]) == run.result["tool_calls"].count("add")


def test_dspy_react(long_server: ServeProcess, tmp_path: Path) -> None:
    """An untrained model writes neither ReAct's ``[[ ## field ## ]]`` sections nor its fields in the JSON
    object dspy then asks for (``json_object``: ReAct's open ``next_tool_args`` keeps dspy from sending a
    schema), so the run ends with dspy's own ``AdapterParseError``, after both calls were served."""
    run = run_agent(long_server, "dspy", tmp_path)
    assert_served_and_trained(run, long_server)
    assert run.error is None or run.error_chain[0].endswith("AdapterParseError"), run.error
    assert len(run.calls) >= (2 if run.error else 1), run.answers  # the ChatAdapter's call, then the JSONAdapter's
