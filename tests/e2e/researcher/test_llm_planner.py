"""The LLM planner path end to end against a real OpenAI-protocol server on loopback.

The server (``scripted_llm.ScriptedLLM``: FastAPI + uvicorn) returns scripted planner answers: it rejects
structured outputs with a 400 (as some servers do), answers the framing step once with invalid
JSON (the planner's repair round must fix it), and writes a client with a runtime bug that the
validate step's smoke run against a real swarm server must catch and the repair step must fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port
from support.scripted_llm import ScriptedLLM

from researcher.planner.llm import LLMPlanner
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import PlannerError
from researcher.runs import record as runs
from researcher.study.events import read_events
from researcher.tracking.llm_traces import RUN_LINK_TAG, PlannerTraces
from researcher.tracking.tracker import Tracker
from researcher.types.design import Framing
from researcher.types.settings import LLMSettings

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = (REPO / "studies" / "examples" / "letters" / "client.py").read_text()
BUGGY = EXAMPLE.replace('return reward(reply.choices[0].message.content or "")',
                        'return reward(reply.choices[0].message.content or "") + bonus_for_length')
FRAMING = {"answerable": True, "reason": "the topic names the group size", "task": "letters", "knob": "group_size",
           "question": "Does a larger group size make letters learn faster per step?", "metric": "train/reward_mean"}
PLAN = {"rationale": "scripted controlled comparison",
        "hypotheses": [{"id": "h1", "statement": "group size 4 learns faster than 2", "metric": "train/reward_mean",
                        "expected_effect": "higher AUC for group_size=4"}],
        "experiments": [{"name": "it1-gs-2", "hypothesis": "h1", "overrides": {"group_size": 2, "batch_groups": 2}},
                        {"name": "it1-gs-4", "hypothesis": "h1", "overrides": {"group_size": 4, "batch_groups": 2}}]}


def _script() -> dict[str, list[Any]]:
    """The planner's answers by step; the framing's first answer is invalid JSON (the repair round fixes it)."""
    return {"frame the research topic": ["Sure! Here is the framing: {answerable: true, task: letters", FRAMING],
            "plan the experiments": [PLAN],
            "write the swarm client": [{"code": BUGGY, "notes": "adds a length bonus"}],
            "repair the client": [{"code": EXAMPLE, "notes": "removed the undefined bonus_for_length"}],
            "decide": [{"action": "conclude", "reason": "scripted: the comparison answers the question"}],
            "write the study's conclusion": [{"answer": "SCRIPTED ANSWER from the LLM planner.",
                                              "discussion": "scripted caveats"}]}


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedLLM, str]]:
    """Refuses structured outputs with a 400 and answers the framing once with invalid JSON."""
    with ScriptedLLM(_script(), structured=False) as llm:
        yield llm, llm.url


@pytest.fixture
def structured() -> Iterator[tuple[ScriptedLLM, str]]:
    """Accepts structured outputs and frames right the first time."""
    with ScriptedLLM({**_script(), "frame the research topic": [FRAMING]}) as llm:
        yield llm, llm.url


def test_structured_outputs_path_needs_one_call(structured: tuple[ScriptedLLM, str]) -> None:
    script, url = structured
    traces: list[dict[str, Any]] = []
    planner = LLMPlanner(LLMSettings(base_url=url, model="scripted", price_in_per_mtok=1.0, price_out_per_mtok=2.0),
                         PromptLibrary(REPO / "prompts"), on_call=traces.append)
    reply = planner.frame("group size on letters?", "catalog")
    assert reply.value == Framing(**FRAMING)
    assert len(script.requests) == 1 and script.requests[0]["response_format"]["type"] == "json_schema"
    assert reply.usage == {"calls": 1, "prompt_tokens": 100, "completion_tokens": 50, "cost_usd": pytest.approx(2e-4)}
    assert traces[0]["step"] == "frame_topic" and traces[0]["mode"] == "structured"


def test_an_unreachable_mlflow_never_fails_a_planner_call(structured: tuple[ScriptedLLM, str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    script, url = structured
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as the researcher CLI bounds it, but tighter
    dead = Tracker(f"http://127.0.0.1:{free_port()}", tmp_path / "mlartifacts")  # nothing listens on that port
    planner = LLMPlanner(LLMSettings(base_url=url, model="scripted"), PromptLibrary(REPO / "prompts"))
    planner.add_listener(PlannerTraces(dead, "s", tmp_path / "llm_calls", lambda: None).record)
    with caplog.at_level("WARNING", logger="researcher.tracking.llm_traces"):
        reply = planner.frame("group size on letters?", "catalog")
    assert reply.value == Framing(**FRAMING) and len(script.requests) == 1
    assert "could not write the planner call frame_topic as an MLflow trace" in caplog.text


def test_invalid_json_gets_one_repair_round_then_fails_clearly(scripted: tuple[ScriptedLLM, str]) -> None:
    script, url = scripted
    planner = LLMPlanner(LLMSettings(base_url=url, model="scripted"), PromptLibrary(REPO / "prompts"))
    reply = planner.frame("group size on letters?", "catalog")
    # 400 on json_schema -> fallback; invalid JSON -> repair round with the validation error.
    assert [bool(r.get("response_format")) for r in script.requests] == [True, False, False]
    assert "That answer is invalid" in script.requests[-1]["messages"][-1]["content"]
    assert reply.value.task == "letters" and reply.usage["calls"] == 2

    script.answer("frame the research topic", "not json")
    with pytest.raises(PlannerError, match="after a repair round"):
        planner.frame("group size on letters?", "catalog")


@pytest.mark.slow
def test_llm_study_end_to_end_repairs_a_buggy_client(cli, scripted: tuple[ScriptedLLM, str], swarm_server: tuple[str, str],
                                                     no_leftover_servers) -> None:
    script, url = scripted
    server_url, token = swarm_server  # an existing server (--server): smoke runs and runs need no server start
    cli.env.update({"RESEARCHER_LLM_BASE_URL": url, "RESEARCHER_LLM_MODEL": "scripted", "OPENAI_API_KEY": "sk-test",
                    "SWARM_TOKEN": token})
    sid = "llm-study"
    done = cli.run("start", "--topic", "Does a larger group size help on letters?", "--budget", "8m", "--study-id", sid,
                   "--server", server_url, "--steps-per-run", "4", "--seeds", "1", "--max-iterations", "2",
                   "--max-runs", "4", *cli.dirs, timeout=480)
    assert done.returncode == 0, done.stdout + done.stderr

    steps = [r["messages"][1]["content"].splitlines()[0] for r in script.requests]
    assert steps[0] == "# Step: frame the research topic"
    assert any(s == "# Step: repair the client after a failed validation" for s in steps)
    repair = next(r for r in script.requests if "# Step: repair the client" in r["messages"][1]["content"])
    assert "bonus_for_length" in repair["messages"][1]["content"]  # the smoke run's traceback was shown
    assert "NameError" in repair["messages"][1]["content"]

    study_dir = cli.studies / sid
    log_md = (study_dir / "LOG.md").read_text()
    assert "Validation attempt 1 FAILED" in log_md and "Validation attempt 2 passed" in log_md
    for name in ("it1-gs-2", "it1-gs-4"):
        assert "bonus_for_length" not in (study_dir / "experiments" / name / "client.py").read_text()
    report = (study_dir / "report.md").read_text()
    assert "SCRIPTED ANSWER from the LLM planner." in report
    # The LLM's question said "per step"; the printed one says which axis the verdict is judged on.
    assert "**Question:** Does a larger group size make letters learn faster per step? (The verdict is judged per " \
           "episode consumed" in report

    status = json.loads(cli.run("status", sid, "--json", *cli.dirs).stdout)
    answered = [r for r in script.requests if not r.get("response_format")]
    assert status["state"] == "done"
    assert status["llm"]["calls"] == len(answered)
    assert status["llm"]["prompt_tokens"] == 100 * len(answered)
    assert status["decision"]["reason"].startswith("scripted")
    traces = sorted((cli.artifacts / sid / "llm_calls").glob("*.json"))
    assert len(traces) == len(script.requests)
    assert any("That answer is invalid" in json.dumps(json.loads(t.read_text())["messages"]) for t in traces)
    _assert_traced_in_mlflow(cli.artifacts / "mlflow.db", sid, [json.loads(t.read_text()) for t in traces])
    events = read_events(cli.artifacts / sid / "events.jsonl")  # the live view's log: a short event per call
    calls = [e for e in events if e["kind"] == "llm_call"]
    assert [c["step"] for c in calls] == [json.loads(t.read_text())["step"] for t in traces]
    assert all(c["tokens"] == 150 and c["summary"] for c in calls if not c["error"])
    assert any(e["kind"] == "client" and e["repaired"] for e in events)
    records = runs.all_records(cli.artifacts / sid / "runs")
    assert [(r.experiment, r.status, r.launches) for r in records] == [("it1-gs-2", "finished", 1),
                                                                       ("it1-gs-4", "finished", 1)]
    assert records[1].base_step >= records[0].target_step  # the second run continued on the same server
    no_leftover_servers(cli.artifacts / sid / "runs")


def _assert_traced_in_mlflow(store: Path, study_id: str, calls: list[dict[str, Any]]) -> None:
    """Every planner call is an MLflow trace on the iteration's run, with its prompt, answer, tokens and latency."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(study_id).experiment_id
    [iteration_run] = client.search_runs([experiment], "tags.`researcher.kind` = 'iteration'")
    linked = client.search_traces(locations=[experiment], run_id=iteration_run.info.run_id)
    everything = client.search_traces(locations=[experiment])
    assert len(linked) == len(everything) == len(calls)  # framing and planning too, linked once the run existed
    by_answer: dict[tuple[str, bool], tuple[Any, Any]] = {}
    for trace in linked:
        [span] = trace.data.spans
        by_answer[json.dumps(span.inputs["messages"]), trace.info.state == "ERROR"] = (trace, span)
        assert trace.info.tags["researcher.study_id"] == study_id and trace.info.tags.get(RUN_LINK_TAG) != "pending"
        assert span.span_type == "CHAT_MODEL" and span.attributes["mlflow.llm.model"] == "scripted"
    for call in calls:
        trace, span = by_answer[json.dumps(call["messages"]), call["error"] is not None]
        assert span.name == trace.info.tags["researcher.step"] == call["step"]
        assert abs(trace.info.execution_duration - call["seconds"] * 1000) <= 2
        if call["error"]:  # the structured-outputs request the server refused with a 400
            assert trace.info.state == "ERROR" and "not supported" in span.attributes["researcher.error"]
        else:
            assert span.outputs["choices"][0]["message"]["content"] == call["answer"]
            assert span.attributes["mlflow.chat.tokenUsage"] == {"input_tokens": 100, "output_tokens": 50,
                                                                   "total_tokens": 150}
    steps = {span.name for _, span in by_answer.values()}
    assert {"frame_topic", "frame_topic:repair", "plan_experiments", "write_client", "repair_client", "decide",
            "write_report"} <= steps
    report = next(span for _, span in by_answer.values() if span.name == "write_report")
    assert "SCRIPTED ANSWER from the LLM planner." in report.outputs["choices"][0]["message"]["content"]
    assert "# Step: write the study's conclusion" in report.inputs["messages"][1]["content"]
