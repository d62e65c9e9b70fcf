"""A slow or weak LLM as the planner: every call bounded by the study's deadline, a refused
``response_format`` asked once, and the offline planner taking any step the LLM fails.

The LLM is ``scripted_llm.ScriptedLLM``, a real OpenAI-protocol server on loopback: it refuses
structured outputs with a 422 (as the swarm server does), answers garbage, or answers only after a
long sleep. The timeout arithmetic is tested on a fake clock; the end-to-end studies run the real
``researcher start`` with a design too small to train anything, so each is framed, planned and
reported in seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import free_port
from support.scripted_llm import ScriptedLLM, Slow

from researcher.planner import catalog
from researcher.planner.deadline import (
    MIN_ATTEMPT_S,
    LLMDeadline,
    attempt_timeout,
    backoff,
    call_within,
)
from researcher.planner.fallback import FallbackPlanner, StepFailed, Takeover
from researcher.planner.llm import LLMPlanner
from researcher.planner.offline import OfflinePlanner
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import OutOfTime
from researcher.session.composition import build_context, build_settings
from researcher.study.events import read_events
from researcher.study.layout import StudyLayout
from researcher.study.store import read_state
from researcher.types.design import Framing
from researcher.types.settings import LLMSettings

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "studies" / "examples"
TOPIC = "Does a larger group size help on letters?"
EXAMPLE = (EXAMPLES / "letters" / "client.py").read_text()
FRAMING = {"answerable": True, "reason": "the topic names the group size", "task": "letters", "knob": "group_size",
           "question": "Does a larger group size make letters learn faster?", "metric": "train/reward_mean"}
PLAN = {"rationale": "scripted controlled comparison",
        "hypotheses": [{"id": "h1", "statement": "group size 4 learns faster than 2", "metric": "train/reward_mean",
                        "expected_effect": "higher AUC for group_size=4"}],
        "experiments": [{"name": "it1-gs-2", "hypothesis": "h1", "overrides": {"group_size": 2, "batch_groups": 2}},
                        {"name": "it1-gs-4", "hypothesis": "h1", "overrides": {"group_size": 4, "batch_groups": 2}}]}
REPORT = {"answer": "SCRIPTED ANSWER from the LLM planner.", "discussion": "scripted caveats"}
DECISION = {"action": "conclude", "reason": "scripted: the comparison answers the question"}
DECIDE_CONTEXT = {"topic": TOPIC, "last": {"iteration": 1, "best": None, "best_value": None, "comparison": None,
                                           "plateau": None, "values": {}}, "tested_values": [], "min_effect": 0.02}


def _script(**steps: Any) -> dict[str, list[Any]]:
    """Valid answers for every step, with ``steps`` (by prompt heading) replacing some."""
    script: dict[str, list[Any]] = {
        "frame the research topic": [FRAMING], "plan the experiments": [PLAN],
        "write the swarm client": [{"code": EXAMPLE, "notes": "the example"}],
        "repair the client": [{"code": EXAMPLE, "notes": "the example"}], "decide": [DECISION],
        "write the study's conclusion": [REPORT]}
    return {**script, **{heading: [answer] for heading, answer in steps.items()}}


def _planner(url: str, deadline: LLMDeadline | None = None,
             **settings: Any) -> tuple[FallbackPlanner, list[Takeover]]:
    """The planner the composition root builds for a study with an LLM, and the takeovers it reports."""
    taken: list[Takeover] = []
    llm = LLMPlanner(LLMSettings(base_url=url, model="scripted", **settings), PromptLibrary(REPO / "prompts"),
                     deadline=deadline)
    return FallbackPlanner(llm, OfflinePlanner(sorted(catalog.examples(EXAMPLES))), taken.append), taken


# ---------------------------------------------------------------------- the timeout arithmetic


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _timing_out(clock: _FakeClock, limits: list[float]) -> Callable[[float], str]:
    """A request that uses its whole limit and times out, as a slow LLM's does."""

    def send(limit: float) -> str:
        limits.append(limit)
        clock.now += limit
        raise TimeoutError(f"no answer within {limit} s")

    return send


def test_timeout_arithmetic_keeps_every_attempt_and_wait_before_the_deadline() -> None:
    assert attempt_timeout(None, 120.0) == 120.0         # no study deadline: the configured timeout
    assert attempt_timeout(500.0, 120.0) == 120.0
    assert attempt_timeout(30.0, 120.0) == 30.0          # cut to the time left
    assert attempt_timeout(MIN_ATTEMPT_S - 0.1, 120.0) is None
    assert [backoff(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]

    clock = _FakeClock()
    deadline = LLMDeadline(clock)
    assert deadline.left("decide") is None
    deadline.set(clock.now + 300.0, report_reserve_s=20.0)
    assert deadline.left("decide") == 280.0 and deadline.left("write_report") == 290.0  # the report: half the reserve

    # 280 s left, 120 s timeouts, 3 retries: 120 + 0.5 + 120 + 1 + 38.5 — the last attempt is cut to what is left.
    limits: list[float] = []
    start = clock.now
    with pytest.raises(TimeoutError):
        call_within(_timing_out(clock, limits), left=lambda: deadline.left("decide"), timeout_s=120.0, max_retries=3,
                    wait=lambda exc, failures: backoff(failures), sleep=clock.sleep)
    assert limits == [120.0, 120.0, pytest.approx(38.5)]
    assert clock.now - start == pytest.approx(280.0)     # ended at the deadline, not after it

    # No time left: no attempt at all.
    with pytest.raises(OutOfTime, match="no time left"):
        call_within(_timing_out(clock, limits), left=lambda: deadline.left("decide"), timeout_s=120.0, max_retries=3,
                    wait=lambda exc, failures: backoff(failures), sleep=clock.sleep)
    assert len(limits) == 3

    # Without a deadline: every retry, each with the whole timeout; a failure not worth retrying is raised at once.
    limits.clear()
    with pytest.raises(TimeoutError):
        call_within(_timing_out(clock, limits), left=lambda: None, timeout_s=60.0, max_retries=2,
                    wait=lambda exc, failures: backoff(failures), sleep=clock.sleep)
    assert limits == [60.0, 60.0, 60.0]
    limits.clear()
    with pytest.raises(TimeoutError):
        call_within(_timing_out(clock, limits), left=lambda: None, timeout_s=60.0, max_retries=2,
                    wait=lambda exc, failures: None, sleep=clock.sleep)
    assert limits == [60.0]


# ---------------------------------------------------------------------- the planner against a real endpoint


def test_refused_response_format_is_asked_once_then_never_again() -> None:
    with ScriptedLLM(_script(), structured=False, refusal=422) as llm:
        planner, taken = _planner(llm.url)
        framing = planner.frame(TOPIC, "catalog").value
        planner.plan(framing, {"iteration": 1, "topic": TOPIC})
        planner.write_client(framing, EXAMPLE, [], {})
        planner.decide(framing, DECIDE_CONTEXT)
        reply = planner.report(framing, {"verdict": "v", "caveats": "c"})
    assert [bool(r.get("response_format")) for r in llm.requests] == [True, False, False, False, False, False]
    assert llm.requests[0]["response_format"]["type"] == "json_schema"
    assert reply.value.answer == REPORT["answer"] and not taken


def test_a_resumed_session_of_the_study_does_not_ask_with_response_format_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the calls' MLflow traces fail fast: nothing listens
    with ScriptedLLM(_script(), structured=False, refusal=422) as llm:
        env = {"RESEARCHER_LLM_BASE_URL": llm.url, "RESEARCHER_LLM_MODEL": "scripted",
               "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}
        settings = build_settings(tmp_path / "studies", tmp_path / "artifacts", env=env)
        for _ in range(2):  # two sessions of one study, each with the planner the composition root builds
            build_context(settings, "refusing").planner.frame(TOPIC, "catalog")
    assert [bool(r.get("response_format")) for r in llm.requests] == [True, False, False]


def test_garbage_past_the_repair_round_is_taken_over_by_the_offline_planner() -> None:
    with ScriptedLLM(_script(decide="Sure! I think we should conclude.")) as llm:
        planner, taken = _planner(llm.url)
        reply = planner.decide(Framing(**FRAMING), DECIDE_CONTEXT)
    # Structured outputs (the answer breaks the schema), the schema in the prompt, one repair round: all garbage.
    assert [bool(r.get("response_format")) for r in llm.requests] == [True, False, False]
    repair = llm.requests[-1]["messages"][-1]["content"]  # the exact validation error, shown to the model
    assert "That answer is invalid: 1 validation error for Decision" in repair and "json_invalid" in repair
    offline = OfflinePlanner(sorted(catalog.examples(EXAMPLES))).decide(Framing(**FRAMING), DECIDE_CONTEXT)
    assert reply.value == offline.value
    assert reply.usage["calls"] == 3 and reply.usage["prompt_tokens"] == 300  # the garbage still cost tokens
    [takeover] = taken
    assert takeover.step == "decide" and "no valid Decision for decide after a repair round" in takeover.reason


def test_a_slow_llm_is_cut_at_the_deadline_and_no_call_starts_after_it() -> None:
    deadline = LLMDeadline()
    with ScriptedLLM(_script(**{"frame the research topic": Slow(60, FRAMING)})) as llm:
        planner, taken = _planner(llm.url, deadline, timeout_s=120.0, max_retries=3)
        deadline.set(time.time() + 3.0, report_reserve_s=0.0)
        started = time.monotonic()
        framing = planner.frame(TOPIC, catalog.describe(EXAMPLES)).value
        took = time.monotonic() - started
        assert took < 4.5, took  # the call ended at the deadline, not after 60 s (nor 120 s, nor 4 tries)
        assert framing.task == "letters" and framing.knob == "group_size"  # the offline planner's framing
        assert len(llm.requests) == 1 and taken[0].step == "frame_topic"
        assert "no answer within" in taken[0].reason and "(the time left before the study's deadline)" in taken[0].reason

        plan = planner.plan(framing, {"iteration": 1, "topic": TOPIC, "task_config": {}}).value
        assert len(llm.requests) == 1  # past the deadline: the offline planner plans without asking the LLM
        assert [e.overrides["group_size"] for e in plan.experiments] == [2, 8]
        assert taken[1].step == "plan_experiments" and "no time left" in taken[1].reason


def test_a_step_neither_planner_can_take_fails_with_both_reasons_and_its_tokens() -> None:
    with ScriptedLLM(_script(**{"frame the research topic": "no idea"}), structured=False) as llm:
        planner, taken = _planner(llm.url)
        with pytest.raises(StepFailed) as failed:
            planner.frame("Is the moon made of cheese?", "catalog")
    message = str(failed.value)
    assert "no valid Framing for frame_topic after a repair round" in message
    assert "The offline planner cannot map this topic" in message and not taken
    # What the graph records for the failing node: failed, with the step's two answered calls counted.
    earlier = {"calls": 1, "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0}
    state = failed.value.failed_state({"phase": "framing", "llm": earlier})
    assert state["phase"] == "failed" and state["error"] == message
    assert state["llm"]["calls"] == 3 and state["llm"]["prompt_tokens"] == 210


# ---------------------------------------------------------------------- whole studies
# One run allowed: the plan's comparison does not fit, so each study is framed, planned and reported
# without training anything (seconds, not minutes), which is all the planner's takeovers need.


def _start(cli: Any, llm: ScriptedLLM, sid: str, budget: str, topic: str = TOPIC) -> Any:
    """``researcher start`` planned by ``llm``, with a design too small for any run."""
    cli.env.update({"RESEARCHER_LLM_BASE_URL": llm.url, "RESEARCHER_LLM_MODEL": "scripted",
                    "OPENAI_API_KEY": "sk-test"})
    return cli.run("start", "--topic", topic, "--budget", budget, "--study-id", sid, "--steps-per-run", "3",
                   "--seeds", "1", "--max-iterations", "1", "--max-runs", "1", *cli.dirs, timeout=180)


@pytest.mark.slow
def test_a_study_goes_on_when_the_offline_planner_takes_over_a_garbage_framing(cli) -> None:
    with ScriptedLLM(_script(**{"frame the research topic": "Sure! {task: letters, knob: group size"}),
                     structured=False, refusal=422) as llm:
        done = _start(cli, llm, "garbage-framing", "5m")
    assert done.returncode == 0, done.stdout + done.stderr
    # The 422 was paid once in the study; the framing got its repair round, then the offline planner framed,
    # and the LLM planned on from the offline framing.
    assert [bool(r.get("response_format")) for r in llm.requests] == [True, False, False, False]
    assert llm.steps == ["frame the research topic"] * 3 + ["plan the experiments of this iteration"]

    events = read_events(cli.artifacts / "garbage-framing" / "events.jsonl")
    [takeover] = [e for e in events if e["kind"] == "takeover"]
    assert takeover["step"] == "frame_topic" and takeover["by"] == "offline"
    assert "no valid Framing for frame_topic after a repair round" in takeover["reason"]
    framed = next(e for e in events if e["kind"] == "framed")
    assert framed["knob"] == "group_size" and framed["question"] != FRAMING["question"]  # the offline framing

    study = cli.studies / "garbage-framing"
    report = (study / "report.md").read_text()
    assert "## Planner takeovers" in report and "- frame_topic at " in report
    assert "no valid Framing for frame_topic after a repair round" in report
    log_md = (study / "LOG.md").read_text()
    assert "The offline planner took over frame_topic" in log_md
    watched = cli.run("watch", "garbage-framing", "--once", *cli.dirs)
    assert "the offline planner took over frame_topic" in " ".join(watched.stdout.split()), watched.stdout
    status = json.loads(cli.run("status", "garbage-framing", "--json", *cli.dirs).stdout)
    assert status["state"] == "done"
    assert status["llm"]["calls"] == 3 and status["llm"]["prompt_tokens"] == 300  # the garbage's tokens count


@pytest.mark.slow
def test_a_slow_llm_is_cut_at_the_deadline_and_the_study_ends_by_it(cli) -> None:
    with ScriptedLLM(_script(**{"plan the experiments": Slow(600, PLAN)})) as llm:
        done = _start(cli, llm, "slow-llm", "60s")
        ended = time.time()
    assert done.returncode == 0, done.stdout + done.stderr
    state = read_state(StudyLayout("slow-llm", cli.studies, cli.artifacts))
    assert state is not None and state["phase"] == "done"
    deadline, reserve = state["budget"]["deadline"], state["budget"]["report_reserve_s"]
    events = read_events(cli.artifacts / "slow-llm" / "events.jsonl")
    [report] = [e for e in events if e["kind"] == "report"]
    assert report["ts"] <= deadline and ended <= deadline + 5  # the study ended by its deadline

    # The planning call (one attempt, not four of 120 s) was cut where the report reserve begins.
    assert llm.steps == ["frame the research topic", "plan the experiments of this iteration"]
    calls = [json.loads(f.read_text()) for f in sorted((cli.artifacts / "slow-llm" / "llm_calls").glob("*.json"))]
    plan = calls[-1]
    assert plan["step"] == "plan_experiments" and "TimeoutError" in plan["error"]
    assert deadline - reserve - 1 <= plan["time"] <= deadline - reserve + 1
    [takeover] = [e for e in events if e["kind"] == "takeover"]
    assert takeover["step"] == "plan_experiments" and "the time left before the study's deadline" in takeover["reason"]
    text = (cli.studies / "slow-llm" / "report.md").read_text()
    assert "## Planner takeovers" in text and "- plan_experiments at " in text


@pytest.mark.slow
def test_a_topic_neither_planner_can_frame_fails_the_study_with_both_reasons(cli) -> None:
    with ScriptedLLM(_script(**{"frame the research topic": "no idea"}), structured=False) as llm:
        done = _start(cli, llm, "moon", "5m", topic="Is the moon made of cheese?")
    assert done.returncode == 3, done.stdout + done.stderr  # what `researcher start` exits with for a failed study
    output = " ".join((done.stdout + done.stderr).split())
    assert "no valid Framing for frame_topic after a repair round" in output
    assert "The offline planner cannot map this topic" in output and "Traceback" not in output
    report = (cli.studies / "moon" / "report.md").read_text()
    assert "**Status:** failed" in report and "cannot map this topic" in report
    state = read_state(StudyLayout("moon", cli.studies, cli.artifacts))
    assert state is not None and state["llm"]["calls"] == 2  # the failed framing's tokens are counted
