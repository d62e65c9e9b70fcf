"""A real small LLM as the planner (issue #50): ``researcher start`` with ``RESEARCHER_LLM_BASE_URL``
at this project's own ``swarm serve --model smollm2-135m``, a real 135M model that writes poor plans
on a busy 2-core machine.

The study must finish with rc 0 by its deadline: the server refuses ``response_format`` (422, asked
once), every call is bounded by what the deadline leaves, an answer that is not valid JSON gets one
repair round, and the offline planner then takes the step. The report names each step it took over,
with the reason the events give, and the LLM's tokens are counted. ``-m study``: SmolLM2 loads in
about a minute and each of its answers to a 3,000-token prompt takes tens of seconds here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import ServeProcess, free_port

from researcher.study.events import read_events
from researcher.study.layout import StudyLayout
from researcher.study.store import read_state

pytestmark = [pytest.mark.slow, pytest.mark.study, pytest.mark.timeout(1500)]

TOPIC = "Does a group size of 8 beat 4 on the letters task?"


def test_smollm2_as_the_planner_finishes_a_letters_study(cli, tmp_path: Path) -> None:
    llm = ServeProcess(port=free_port(), state_dir=tmp_path / "llm", model="smollm2-135m").start(600)
    try:
        cli.env.update({"RESEARCHER_LLM_BASE_URL": f"{llm.url}/v1", "RESEARCHER_LLM_MODEL": "smollm2-135m",
                        "OPENAI_API_KEY": llm.token})
        done = cli.run("start", "--topic", TOPIC, "--budget", "12m", "--study-id", "small-llm",
                       "--steps-per-run", "3", "--seeds", "1", "--max-iterations", "1", "--max-runs", "2",
                       *cli.dirs, timeout=1200)
    finally:
        llm.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr

    state = read_state(StudyLayout("small-llm", cli.studies, cli.artifacts))
    assert state is not None and state["phase"] == "done"
    events = read_events(cli.artifacts / "small-llm" / "events.jsonl")
    takeovers = [e for e in events if e["kind"] == "takeover"]
    calls = [json.loads(f.read_text()) for f in sorted((cli.artifacts / "small-llm" / "llm_calls").glob("*.json"))]
    assert calls, "the planner never called SmolLM2"
    refused = [c for c in calls if "422" in (c["error"] or "")]
    assert len(refused) <= 1, refused  # the server's 422 for response_format is asked once in a study
    report = (cli.studies / "small-llm" / "report.md").read_text()
    if takeovers:  # a 135M model's plans: expected, but a valid answer is no failure of the study
        assert "## Planner takeovers" in report
        for takeover in takeovers:
            assert takeover["by"] == "offline"
            assert f"- {takeover['step']} at " in report, (takeover, report)
    status = json.loads(cli.run("status", "small-llm", "--json", *cli.dirs).stdout)
    assert status["llm"]["calls"] >= 1 and status["llm"]["prompt_tokens"] > 1000  # the framing prompt alone
    print(f"takeovers: {[(t['step'], t['reason'][:120]) for t in takeovers]}; llm: {status['llm']}; "
          f"calls: {[(c['step'], round(c['seconds']), (c['error'] or '')[:80]) for c in calls]}")
