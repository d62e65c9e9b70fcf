"""Credentials survive a crash and the client token stays in its lane (issue 14, real processes).

A ``swarm serve`` started without a token generates its control token and client token into its
state dir (0700, files 0600). A ``swarm run`` process that knows only ``SWARM_CLIENT_TOKEN`` (no
control token anywhere: not in its environment, not in its ``--state-dir``) trains the server. The
client token is refused (403, naming the control token) on config, control, SFT, metrics, events and
chat, and nothing it asked for happens. Then the server is SIGKILLed and restarted on the same state
dir and port: both tokens are the same as before, and the ``swarm run`` started before the kill keeps
claiming, its later episodes train (the step advances past the restored one), and its log shows no 401.
The rules for which token wins are checked on the functions ``swarm serve`` uses, without a server.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rel_harness import start_server
from support import ServeProcess, free_port, wait_for

from swarm.server.auth import private_dir, resolve_client_token, resolve_token

CONFIG = {"group_size": 2, "min_group_size": 1, "batch_groups": 1, "max_tokens": 4, "checkpoint_every": 1,
          "lease_s": 5.0, "batch_window_ms": 5.0}

STUDY = '''
import random


def tasks(seed):
    i = 0
    while True:
        i += 1
        yield {"task_id": f"t{i}"}


def workflow(ep, task):
    ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": "abc"}], max_tokens=4)
    return random.random()  # rewards that differ, so every group carries a training signal
'''

# Control-only routes, called with the client token: each must be a 403 that does nothing.
REFUSED = (("PATCH", "/api/v1/config", {"values": {"lr": 0.5}}), ("POST", "/api/v1/control/stop", None),
           ("POST", "/api/v1/control/pause", None), ("POST", "/api/v1/control/sft", {"examples": [], "steps": 1}),
           ("GET", "/api/v1/metrics", None), ("GET", "/api/v1/events", None), ("GET", "/api/v1/config", None),
           ("POST", "/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "x"}]}))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _credentials(state: Path) -> tuple[str, str]:
    """The two tokens on disk, after checking the state dir and the files are the owner's only."""
    assert _mode(state) == 0o700, oct(_mode(state))
    for name in ("token", "client_token", "secret"):
        assert _mode(state / name) == 0o600, (name, oct(_mode(state / name)))
    return (state / "token").read_text().strip(), (state / "client_token").read_text().strip()


def test_client_token_run_survives_server_sigkill_and_is_refused_control(
        rel_model: Path, tmp_path: Path, servers: list[ServeProcess]) -> None:
    state, port = tmp_path / "state", free_port()
    servers.append(start_server(rel_model, state, port=port, token=None, config=CONFIG))
    server = servers[-1]
    control, client_token = _credentials(state)
    assert server.token == control and client_token and client_token != control

    # Boxed study code holds only the client token; its setup() may warm up a fresh server, once.
    warmup = {"examples": [{"messages": [{"role": "user", "content": "hi"}], "completion": "ab"}], "steps": 1}
    with server.http(client_token) as http:
        assert http.post("/api/v1/control/sft", json=warmup).status_code == 200
        again = http.post("/api/v1/control/sft", json=warmup)
        assert again.status_code == 403 and "fresh server" in again.json()["error"]["message"]

    study = tmp_path / "study.py"
    study.write_text(STUDY)
    run_log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SWARM_TOKEN", "SWARM_CLIENT_TOKEN")}
    env["SWARM_CLIENT_TOKEN"] = client_token
    with run_log.open("wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "swarm.cli", "run", str(study), "--server", server.url,
                                "--state-dir", str(tmp_path / "no-state"), "--group-size", "2", "--concurrency", "2",
                                "--retry-for", "120"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: server.status()["step"] >= 1, 90, what="a step from the client-token run",
                 log=run_log, interval=0.2)

        with server.http(client_token) as http:
            for method, path, body in REFUSED:
                response = http.request(method, path, json=body, params={"timeout_s": 1})
                assert response.status_code == 403, (method, path, response.text)
                message = response.json()["error"]["message"]
                assert "client token" in message and ("control token" in message or "episode key" in message), message
            assert http.get("/api/v1/status").status_code == 200  # read-only status is open to it
        status = server.status()
        assert status["state"] in ("running", "training") and status["config_version"] == 0

        server.kill()
        servers.append(start_server(rel_model, state, port=port, token=None, config=CONFIG))
        server = servers[-1]
        assert _credentials(state) == (control, client_token)  # same state dir, same tokens
        restored = server.status()
        # The run's episodes finish on the new server; then a step trains past everything held at that
        # moment (a restored partial group whose lease ran out may train first, with min_group_size 1).
        wait_for(lambda: server.status()["episodes"]["finished"] > restored["episodes"]["finished"], 90,
                 what="an episode finished after the restart", log=run_log, interval=0.2)
        held = server.status()
        beyond = held["step"] + held["groups_pending"]
        wait_for(lambda: server.status()["step"] > beyond, 90,
                 what="a step on episodes after the restart", log=run_log, interval=0.2)
        assert run.poll() is None, "the run stopped instead of carrying on after the restart"
    finally:
        run.send_signal(signal.SIGINT)  # the CLI finishes or aborts its episodes in flight and exits
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    output = run_log.read_text(errors="replace")
    # A 401 shows as "401 unauthorized: ..." (SwarmHTTPError) or the openai SDK's AuthenticationError.
    assert "unauthorized" not in output.lower() and "AuthenticationError" not in output, output[-3000:]
    assert "claim failed" not in output, output[-3000:]  # (an episode in flight at the kill may abort)


def test_token_rules_given_then_persisted_then_generated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    private_dir(state)
    assert _mode(state) == 0o700  # an existing state dir is tightened too
    with pytest.raises(ValueError, match="without a token"):
        resolve_token("0.0.0.0", None, state)  # nothing to reuse and not loopback: refused, nothing written
    assert not (state / "token").exists()
    control = resolve_token("127.0.0.1", None, state)
    assert _mode(state / "token") == 0o600
    assert resolve_token("127.0.0.1", None, state) == control  # read back, not regenerated
    assert resolve_token("0.0.0.0", None, state) == control  # a persisted token is a token
    assert resolve_token("127.0.0.1", "given", state) == "given" and (state / "token").read_text() == control

    client = resolve_client_token(None, state, control)
    assert client != control and _mode(state / "client_token") == 0o600
    assert resolve_client_token(None, state, control) == client
    assert resolve_client_token("from-env", state, control) == "from-env"
    assert (state / "client_token").read_text() == client  # a given token is not written
    with pytest.raises(ValueError, match="differ from the control token"):
        resolve_client_token(control, state, control)
