"""A weight publication that fails never leaves the generator silently behind.

A real server composed of a torch generator and a separate torch trainer (so publishing is a real
copy, as with any pair of engines). The seam is the generator model's ``load_weights``, the
in-process generator's transfer: it raises once, then hangs once past ``publish_timeout_s``. Each
time the step loop reports an ``error`` event (``where=publish``) and ``last_error``, restarts the
generator on the new weights (for an in-process model: loads them again), records
``perf/generator_lag`` 0, and the next completions carry the new version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from server_harness import RunningServer
from support import wait_for

from swarm.backends.torch import TorchBackend
from swarm.server import ServerConfig, ServerSettings, create_app

TIMEOUT_S = 1.0


class FlakyGeneratorModel(TorchBackend):
    """The generator's model: its ``load_weights`` (how published weights reach it) fails as scripted."""

    script: list[str]
    release: threading.Event

    def load_weights(self, version, weights) -> None:  # type: ignore[no-untyped-def]
        action = self.script.pop(0) if self.script else "load"
        if action == "raise":
            raise RuntimeError("injected: the transfer broke")
        if action == "hang":  # stuck until the test lets it go (after the timeout fired)
            self.release.wait(30)
        super().load_weights(version, weights)


@pytest.fixture
def server(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[RunningServer, FlakyGeneratorModel]]:
    generator_model = FlakyGeneratorModel.from_model(str(tiny_model), seed=0)
    generator_model.script, generator_model.release = [], threading.Event()
    trainer = TorchBackend.from_model(str(tiny_model), seed=0)
    config = ServerConfig().patched({"group_size": 1, "min_group_size": 1, "batch_groups": 1, "lr": 0.05,
                                     "publish_timeout_s": TIMEOUT_S, "mode": "sync"})
    settings = ServerSettings(model=str(tiny_model), port=0, state_dir=tmp_path / "state", token="test-token",
                              config=config)
    app = create_app(settings, generator_model, trainer=trainer)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    wait_for(lambda: uv.started, 30)
    port = uv.servers[0].sockets[0].getsockname()[1]
    running = RunningServer(url=f"http://127.0.0.1:{port}", token="test-token", core=app.state.ctx.core,
                            state_dir=tmp_path / "state", server=uv, thread=thread)
    yield running, generator_model
    generator_model.release.set()
    running.stop()


def _episode_version(server: RunningServer, task: str) -> tuple[int, str, str]:
    """Claim an episode and chat once; (the completion's policy version, episode id, api key)."""
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": task}).json()
    with server.client(episode["api_key"]) as http:
        reply = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "say a"}],
                                                        "max_tokens": 6})
    assert reply.status_code == 200, reply.text
    return reply.json()["policy_version"], episode["episode_id"], episode["api_key"]


def _finish(server: RunningServer, episode_id: str, key: str) -> None:
    with server.client(key) as http:
        http.post(f"/api/v1/episodes/{episode_id}/finish", json={"reward": 1.0}).raise_for_status()


def test_a_publication_that_raises_or_hangs_restarts_the_generator_on_the_new_version(server) -> None:
    running, model = server
    core = running.core
    events: list[tuple[str, dict]] = []

    class Recorder:  # a core listener (``ServerCore.add_listener``)
        def on_event(self, type_: str, data: dict) -> None:
            events.append((type_, dict(data)))

    core.add_listener(Recorder())

    for step, failure in ((1, "raise"), (2, "hang")):
        model.script.append(failure)
        version, episode_id, key = _episode_version(running, f"t{step}")
        assert version == step - 1
        started = time.monotonic()
        _finish(running, episode_id, key)
        if failure == "hang":  # the timeout fires first; only then does the stuck transfer return
            wait_for(lambda: any(t == "error" for t, d in events if d.get("step") == 1), 10)
            assert time.monotonic() - started >= TIMEOUT_S
            model.release.set()
        wait_for(lambda s=step: core.step == s, 30)

        errors = [d for t, d in events if t == "error"]
        assert errors[-1]["where"] == "publish" and f"policy version {step}" in errors[-1]["message"]
        assert ("took longer than publish_timeout_s=1 s" if failure == "hang" else "injected: the transfer broke") \
            in errors[-1]["message"]
        assert core.status().last_error.where == "publish"
        recovered = [d for t, d in events if t == "generator.recovered"]
        assert recovered[-1]["policy_version"] == step and recovered[-1]["generator_version"] == step
        assert core.generator.policy_version == step
        assert core.metrics[-1].metrics["perf/generator_lag"] == 0.0
        next_version, episode_id, key = _episode_version(running, f"after{step}")
        assert next_version == step  # the next step's completions carry the new version
        with running.client(key) as http:
            http.post(f"/api/v1/episodes/{episode_id}/abort", json={"reason": "probe only"})
    assert len([d for t, d in events if t == "error"]) == 2
