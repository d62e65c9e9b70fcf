"""The ``swarm`` CLI as users run it: real subprocesses against a real server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from pydantic import TypeAdapter
from support import ROOT, SWARM, ServeProcess, wait_for

from swarm.protocol import ConfigView, Status, StepMetrics


def swarm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "SWARM_TOKEN"}
    full_env.update(env or {})
    full_env["COLUMNS"] = "200"
    return subprocess.run([*SWARM, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=full_env)


def test_status_json_finds_the_token_in_the_state_dir(server: ServeProcess) -> None:
    result = swarm("status", server.url, "--json", "--state-dir", str(server.state_dir))
    assert result.returncode == 0, result.stderr
    status = Status.model_validate_json(result.stdout)
    assert status.model and status.policy_version >= 0
    assert (status.defaults.source, status.defaults.keys) == ("built-in", {})  # the tiny preset's own

    table = swarm("status", server.url, "--token", server.token)
    assert table.returncode == 0 and "policy version" in table.stdout
    (row,) = [line for line in table.stdout.splitlines() if "│ defaults " in line]
    assert "built-in (ServerConfig's, sized for the tiny presets)" in row, table.stdout


def test_status_without_a_valid_token_fails_cleanly(server: ServeProcess, tmp_path: Path) -> None:
    result = swarm("status", server.url, "--state-dir", str(tmp_path), env={"SWARM_TOKEN": "nope"})
    assert result.returncode == 1
    assert "401" in result.stderr and "Traceback" not in result.stderr


def test_config_show_patch_and_reject(server: ServeProcess) -> None:
    state = ["--state-dir", str(server.state_dir)]
    shown = ConfigView.model_validate_json(swarm("config", server.url, "--json", *state).stdout)
    patched = swarm("config", server.url, "temperature=0.7", "adv_estimator=grpo", "--json", *state)
    assert patched.returncode == 0, patched.stderr
    view = ConfigView.model_validate_json(patched.stdout)
    assert view.values["temperature"] == 0.7 and view.version == shown.version + 1

    bad = swarm("config", server.url, "temperature=99", *state)
    assert bad.returncode == 1 and "temperature" in bad.stderr
    malformed = swarm("config", server.url, "temperature", *state)
    assert malformed.returncode == 2 and "KEY=VALUE" in malformed.stderr
    after = ConfigView.model_validate_json(swarm("config", server.url, "--json", *state).stdout)
    assert after.version == view.version and after.values["temperature"] == 0.7  # bad input changed nothing
    table = swarm("config", server.url, *state).stdout
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table.splitlines() if "│" in line]
    section, _key, _value, meaning = next(row for row in rows if row[1] == "max_staleness")
    assert section == "batching" and meaning.startswith("async: oldest policy lag")  # each key's section, meaning


def test_key_mints_a_run_key_whose_calls_name_their_episode(server: ServeProcess) -> None:
    state = ["--state-dir", str(server.state_dir)]
    minted = swarm("key", "--run", "cli-run", server.url, *state)
    assert minted.returncode == 0, minted.stderr
    key = minted.stdout.strip()
    assert key.startswith("run.cli-run.") and f"{server.url}/v1" in minted.stderr
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        answer = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        episode = answer.headers["x-swarm-episode"]
        assert answer.json()["episode_id"] == episode
        assert http.post(f"/api/v1/episodes/{answer.json()['id']}/abort").json()["episode_id"] == episode
    bad = swarm("key", "--run", "a.b", server.url, *state)
    assert bad.returncode == 2 and "--run 'a.b'" in bad.stderr and "Traceback" not in bad.stderr


def test_metrics_json_parses_as_protocol(server: ServeProcess) -> None:
    result = swarm("metrics", server.url, "--json", "--state-dir", str(server.state_dir))
    assert result.returncode == 0, result.stderr
    TypeAdapter(list[StepMetrics]).validate_python(json.loads(result.stdout))


def test_serve_rejects_a_broken_config_file_before_loading_a_model(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("lr = [1, 2\n")
    result = swarm("serve", "--config", str(broken), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2 and "config" in result.stderr
    wrong_key = tmp_path / "wrong.toml"
    wrong_key.write_text("learning_rate = 0.1\n")
    result = swarm("serve", "--config", str(wrong_key), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2 and "learning_rate" in result.stderr


def test_run_rejects_a_file_that_is_not_a_study(server: ServeProcess, tmp_path: Path) -> None:
    not_study = tmp_path / "client.py"
    not_study.write_text("x = 1\n")
    result = swarm("run", str(not_study), "--server", server.url, "--state-dir", str(server.state_dir))
    assert result.returncode == 2 and "tasks" in result.stderr


def test_a_study_runs_as_a_plain_python_script(server: ServeProcess) -> None:
    """`python CLIENT.py --server URL` works through run_study_cli(__file__)."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SWARM_TOKEN"}
    result = subprocess.run([sys.executable, str(ROOT / "studies/examples/letters/client.py"), "--server", server.url,
                             "--episodes", "8", "--concurrency", "4", "--group-size", "4",
                             "--state-dir", str(server.state_dir)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "finished=8 aborted=0" in result.stdout


SLOW_STUDY = '''"""Letters whose every episode takes a second (an agent waiting on a tool), with its held-out set.
Once {stop_file!r} exists, the first episode to see it sends SIGTERM to its own thread: the kernel may
hand a process's signal to any thread, and the run must stop as it does when the main thread takes it."""
import os
import signal
import threading
import time

from swarm.client import load_study

letters = load_study({letters!r})
GROUP_SIZE, CONCURRENCY, EVAL_EVERY = 4, 8, 5
tasks, heldout = letters.tasks, letters.heldout
signalled = threading.Lock()


def workflow(ep, task):
    time.sleep(1.0)
    if os.path.exists({stop_file!r}) and signalled.acquire(blocking=False):
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    return letters.workflow(ep, task)
'''


@pytest.mark.parametrize("how", ["sent to the process", "caught by a worker thread"])


def test_sigterm_stops_a_run_like_ctrl_c_and_releases_its_held_out_round(new_server, tmp_path: Path,
                                                                         how: str) -> None:
    """A terminated `swarm run` releases its claims at once: the held-out episodes it queued are aborted
    and the ones in flight finished. Before, they stayed claimed until their 60 s leases expired, and
    the live held-out round held the server's next training step that long: the next client on the
    server trained nothing meanwhile. A fresh server: at step 0 the first claim claims a round (on the
    shared one, at a step no multiple of 5, it would not)."""
    import os
    import signal
    import time

    from swarm.client import SwarmClient

    server = new_server()
    client_py = tmp_path / "slow.py"
    stop_file = tmp_path / "stop"
    client_py.write_text(SLOW_STUDY.format(letters=str(ROOT / "studies/examples/letters/client.py"),
                                           stop_file=str(stop_file)))
    env = {k: v for k, v in os.environ.items() if k != "SWARM_TOKEN"}
    with SwarmClient(server.url, token=server.token) as client:
        before = client.status()
        run = subprocess.Popen([*SWARM, "run", str(client_py), "--server", server.url, "--state-dir",
                                str(server.state_dir)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        try:
            # The first claim (at step 0) claims the held-out round too, before its own episode runs.
            wait_for(lambda: client.status().episodes.claimed >= before.episodes.claimed + 8, 60,
                     what="the run's first claims with their held-out round", proc=run, interval=0.1)
            if how == "sent to the process":
                run.send_signal(signal.SIGTERM)
            else:
                stop_file.touch()
            output, _ = run.communicate(timeout=30)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
        assert run.returncode == 130 and "interrupted" in output, output[-2000:]
        assert "held-out evaluation of step" in output  # a round was claimed, then released

        # The next client trains at once: no held-out round of the stopped one is left live.
        started = time.monotonic()
        done = swarm("run", str(ROOT / "studies/examples/letters/client.py"), "--server", server.url, "--episodes",
                     "32", "--group-size", "4", "--concurrency", "16", "--eval-every", "0", "--state-dir",
                     str(server.state_dir))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert client.status().step > before.step, f"no step in {time.monotonic() - started:.0f} s"


def test_serve_takes_the_model_from_the_config_file_unless_the_flag_names_one(tmp_path: Path) -> None:
    # Both models are missing folders, so serve stops before loading anything; its error names the one chosen.
    config = tmp_path / "model.toml"
    config.write_text('model = "/nonexistent/from-config"\nlr = 1e-3\n')
    assert swarm("serve", "--config", str(config), "--check").returncode == 0  # `model` is a key a file may set
    from_file = swarm("serve", "--config", str(config), "--state-dir", str(tmp_path / "s1"), "--port", "0")
    assert from_file.returncode == 2 and "/nonexistent/from-config" in from_file.stderr, from_file.stderr
    flag = swarm("serve", "--config", str(config), "--model", "/nonexistent/from-flag",
                 "--state-dir", str(tmp_path / "s2"), "--port", "0")
    assert flag.returncode == 2 and "/nonexistent/from-flag" in flag.stderr, flag.stderr
