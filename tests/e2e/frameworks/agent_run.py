"""One framework's agent against a real ``swarm serve``, as a user would run it: a run key, the agent's own
code in ``.venv-frameworks`` (``.ci/setup-frameworks``) with only ``base_url``, ``api_key`` and the model
name set, then a reward for every episode its calls opened, and a training step.

``run_agent`` starts ``agents/observe.py agents/<name>_agent.py`` (it prints what the agent returned or
raised) with its ``base_url`` on an ``AnswerRecorder`` in front of the server (the status of every answer
the agent got). It finds the episodes the agent's run key opened in the server's event stream
(``episode.claimed`` events whose client is ``run:<name>``, replayed from the first event), finishes
each (reward 1 when the agent ended without an exception, else 0) and waits until they trained.
``assert_served_and_trained`` is what every framework test asserts: every call answered 200, no error
on the server, every episode the agent opened finished and trained, in at least one new step.

One server serves a module's agents one after another (``serve``), so a run's counts are what changed
while it ran. It is tuned for a handful of episodes an agent, not for learning: groups of one, a step
per group, no admission wait (an agent opens its episodes before any reward comes) and leases long
enough for a slow agent on a busy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from answer_recorder import AnswerRecorder
from support import ROOT, ServeProcess, free_port, wait_for

from swarm.client import SwarmClient
from swarm.protocol import Status

PYTHON = ROOT / ".venv-frameworks" / "bin" / "python"
AGENTS = Path(__file__).resolve().parent / "agents"
SERVED_NAME = "gpt-4o-mini"  # a name llama-index's OpenAI and autogen's client know (--served-model-name)
# Every framework test runs its agent in .venv-frameworks (.ci/setup-all builds it): missing, they fail, naming it.
needs_frameworks = pytest.mark.usefixtures("frameworks_python")

CONFIG = """
group_size = 1
min_group_size = 1
batch_groups = 1
admission = false
max_staleness = 64
lease_s = 900
"""
# Kept out of the agent's process: swarm's credentials, this checkout's modules, the frameworks' phoning
# home (there is no network) and their writing into the user's home.
_QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "CREWAI_TELEMETRY_OPT_OUT": "true", "OTEL_SDK_DISABLED": "true",
          "HAYSTACK_TELEMETRY_ENABLED": "False", "AGNO_TELEMETRY": "false", "ANONYMIZED_TELEMETRY": "False",
          "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}
_DROPPED = ("PYTHONPATH", "SWARM_TOKEN", "SWARM_CLIENT_TOKEN", "OPENAI_API_KEY", "OPENAI_BASE_URL")


@dataclass
class AgentRun:
    """What one agent run did: its result or the exception it ended with, the HTTP answers it got, the
    episodes its calls opened, and what changed on the server until they trained."""

    result: dict[str, Any] | None
    error: str | None
    error_chain: list[str]
    answers: list[tuple[str, str, int]]
    episodes: list[str]
    before: Status
    after: Status | None = None
    steps: list[dict[str, float]] = field(default_factory=list)  # the metrics of the steps since the run began

    @property
    def calls(self) -> list[int]:
        """The status of every chat call the agent sent."""
        return [status for _, path, status in self.answers if path.endswith("/chat/completions")]

    def grew(self, count: str) -> int:
        """How much ``status.episodes.<count>`` grew from the run's start to its episodes' training."""
        assert self.after is not None, "the run's episodes have not trained"
        return int(getattr(self.after.episodes, count) - getattr(self.before.episodes, count))


def serve(tmp_path: Path, model: str = "tiny") -> ServeProcess:
    """A started ``swarm serve --model MODEL --served-model-name gpt-4o-mini`` with ``CONFIG``; the caller
    stops it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.toml").write_text(CONFIG)
    return ServeProcess(port=free_port(), state_dir=tmp_path / "state", config=tmp_path / "config.toml", model=model,
                        extra_args=("--served-model-name", SERVED_NAME)).start()


def run_agent(server: ServeProcess, name: str, tmp_path: Path, model: str = SERVED_NAME,
              timeout_s: float = 240) -> AgentRun:
    """Run ``agents/<name>_agent.py`` against ``server`` with a run key named ``name``, reward its episodes,
    wait until they trained (see the module docstring)."""
    with SwarmClient(server.url, token=server.token, retry_for_s=10) as control:
        key = control.run_key(name).api_key
        before = control.status()
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    log = tmp_path / f"{name}.log"
    started = time.monotonic()
    with AnswerRecorder(server.url) as recorder, open(log, "w") as out:
        env.update(_QUIET, HOME=str(home), SWARM_BASE_URL=f"{recorder.url}/v1", SWARM_RUN_KEY=key, SWARM_MODEL=model)
        done = subprocess.run([str(PYTHON), str(AGENTS / "observe.py"), str(AGENTS / f"{name}_agent.py")],
                              cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    text = log.read_text(errors="replace")
    observed = [line for line in text.splitlines() if line.startswith('{"result"')]
    assert done.returncode == 0 and observed, f"the agent's process failed ({done.returncode}):\n{text[-4000:]}"
    outcome = json.loads(observed[-1])
    run = AgentRun(outcome["result"], outcome["error"], outcome["error_chain"], recorder.answers,
                   _claimed(server, f"run:{name}"), before)
    ran = time.monotonic()
    _train(server, key, run)
    print(f"{name}: {len(run.calls)} chat calls {sorted(set(run.calls))}, {len(run.episodes)} episodes, ended with "
          f"{run.error_chain[0] if run.error_chain else 'a result'}; agent {ran - started:.1f} s, "
          f"rewards to trained {time.monotonic() - ran:.1f} s")
    return run


def assert_served_and_trained(run: AgentRun, server: ServeProcess) -> None:
    """Every chat call answered 200 (none refused, none failed and retried), nothing went wrong on the
    server, and every episode the agent opened finished and trained, in at least one new step."""
    assert run.calls and all(status == 200 for status in run.calls), (run.answers, run.error)
    assert not any("APIStatusError" in name or "HTTPStatusError" in name for name in run.error_chain), run.error
    assert run.after is not None and run.after.last_error is None, run.after and run.after.last_error
    assert "unhandled error" not in server.log(), server.log()[-3000:]
    assert len(run.episodes) >= 1 and run.grew("finished") == run.grew("trained") == len(run.episodes), run.after
    assert run.steps and sum(step["train/episodes"] for step in run.steps) == len(run.episodes), run.steps


def _claimed(server: ServeProcess, client_id: str) -> list[str]:
    """The episodes ``client_id`` claimed on ``server``: the event stream replayed from the start, read up
    to the last claim the server has counted (the agent has exited, so its claims are all among them)."""
    with SwarmClient(server.url, token=server.token, timeout=30, retry_for_s=0) as control:
        expected = control.status().episodes.claimed
        seen, mine = 0, []
        if expected == 0:
            return mine
        for event in control.events(last_event_id=0, reconnect=False):
            if event.type == "episode.claimed":
                seen += 1
                if event.data.get("client_id") == client_id:
                    mine.append(str(event.data["episode_id"]))
                if seen == expected:
                    return mine
    raise AssertionError(f"the event stream ended after {seen} of {expected} claims")


def _train(server: ServeProcess, key: str, run: AgentRun) -> None:
    """Finish the run's episodes with its run key and wait until they trained."""
    reward = 1.0 if run.error is None else 0.0
    with SwarmClient(server.url, token=server.token, client_token=key, retry_for_s=10) as swarm:
        for episode in run.episodes:
            swarm.finish(episode, reward)
        target = run.before.episodes.trained + len(run.episodes)
        run.after = wait_for(lambda: (s := swarm.status()).episodes.trained >= target and s, timeout=120,
                             what=f"the {len(run.episodes)} episodes of the agent's run to train",
                             log=server.log_path)
        run.steps = [m.metrics for m in swarm.metrics(since_step=run.before.step)]
