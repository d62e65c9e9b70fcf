"""`swarm serve --mlflow-uri` is the one MLflow writer of its run (issue 15), with real processes: a
`swarm serve` + `swarm run` of the letters example, a SQLite store, and a real `mlflow server` started
on a port the swarm server had found dead.

Time goes to starting processes: the two swarm servers start together (module fixture), and the
dead-port test's MLflow store is created meanwhile (MLflow's first open of a new SQLite file costs
5-15 s here). The `mlflow server` runs without its job executor (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false),
which made its start-up several times slower (13 s instead of 52 s on a loaded 2-core machine). The
swarm servers get MLFLOW_HTTP_REQUEST_MAX_RETRIES=0, so the dead-port one notices the returning MLflow
within seconds (with MLflow's default of 7 retries one attempt lasts minutes; training is unaffected
either way).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ROOT, SWARM, ServeProcess, free_port, study_run, wait_for

from swarm.client import SwarmClient
from swarm.protocol import ServerState, StepMetrics

LETTERS = ROOT / "studies" / "examples" / "letters"
MLFLOW_CLI = Path(sys.executable).parent / "mlflow"
# Letters with a step per group of 8, one group in flight (`swarm run --concurrency 8`: nothing generated
# goes stale) and a checkpoint every 5 steps.
CONFIG = ('lr = 1e-3\ngroup_size = 8\nbatch_groups = 1\nmax_tokens = 16\nmode = "async"\nmax_staleness = 2\n'
          'checkpoint_every = 5\n')
RUN_ARGS = ("--concurrency", "8")


@dataclass
class Setup:
    """The module's swarm servers: ``direct`` logs to a SQLite file, ``dead`` to a port nothing listens
    on until the test starts a real ``mlflow server`` there, on the store ``dead_store``."""

    direct: ServeProcess
    direct_uri: str
    dead: ServeProcess
    dead_port: int
    dead_store: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("server-mlflow")
    config = folder / "config.toml"
    config.write_text(CONFIG)
    direct_uri = f"sqlite:///{folder / 'direct.db'}"  # a new store: the server creates its tables
    dead_port = free_port()

    def server(name: str, uri: str, experiment: str) -> ServeProcess:
        return ServeProcess(port=free_port(), state_dir=folder / name, config=config,
                            extra_args=("--mlflow-uri", uri, "--mlflow-experiment", experiment))

    made = Setup(direct=server("direct", direct_uri, "manual"), direct_uri=direct_uri,
                 dead=server("dead", f"http://127.0.0.1:{dead_port}", "spooled"), dead_port=dead_port,
                 dead_store=folder / "served.db")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # inherited by the swarm servers
        env.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        try:
            with ThreadPoolExecutor(3) as pool:
                jobs = [pool.submit(made.direct.start), pool.submit(made.dead.start),
                        pool.submit(_create_tables, made.dead_store)]
                for job in jobs:
                    job.result()
            yield made
        finally:
            made.direct.stop()
            made.dead.stop()


def _pause_and_read(client: SwarmClient) -> list[StepMetrics]:
    """Every step the server will ever have: training paused, the step in progress committed (call it
    once the client is gone: a client whose claims are refused while paused keeps retrying)."""
    client.control("pause")
    wait_for(lambda: client.status().state is ServerState.paused, 120, what="the server to pause", interval=0.25)
    return client.metrics()


def _swarm_stop(server: ServeProcess) -> None:
    """`swarm stop` (checkpoint, then exit) and wait for the process to end."""
    done = subprocess.run([*SWARM, "stop", server.url, "--state-dir", str(server.state_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert server.process is not None
    assert server.process.wait(timeout=60) == 0, server.log()[-3000:]


def _the_run(client: Any, experiment: str) -> Any:
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    assert len(runs) == 1, f"expected one run in {experiment!r}, got {len(runs)}"
    return runs[0]


def _assert_every_step_once(client: Any, run_id: str, steps: list[StepMetrics]) -> None:
    """Each key of /api/v1/metrics has exactly one point per step, with the server's value."""
    keys = sorted({k for s in steps for k in s.metrics})
    assert "train/reward_mean" in keys
    for key in keys:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        expected = [(s.step, s.metrics[key]) for s in steps if key in s.metrics]
        assert [step for step, _ in history] == [step for step, _ in expected], key
        for (_, got), (_, want) in zip(history, expected, strict=True):
            assert got == want or (math.isnan(got) and math.isnan(want)), key


def test_a_manual_run_is_one_mlflow_run_with_params_every_step_checkpoints_and_status(
        setup: Setup, tmp_path: Path) -> None:
    server, uri = setup.direct, setup.direct_uri
    with SwarmClient(server.url, token=server.token) as client:
        with study_run(LETTERS / "client.py", server, tmp_path / "run.log", RUN_ARGS):
            wait_for(lambda: len(client.metrics()) >= 10, 120, what="10 training steps", interval=0.25)
        steps = _pause_and_read(client)
    _swarm_stop(server)

    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tracking_uri=uri)
    run = _the_run(mlflow, "manual")
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert {k: params[k] for k in ("model", "engine", "trainer", "lr", "group_size", "batch_groups")} == {
        "model": "tiny", "engine": "torch", "trainer": "torch", "lr": "0.001", "group_size": "8", "batch_groups": "1"}
    _assert_every_step_once(mlflow, run.info.run_id, steps)
    assert len(steps) >= 10
    checkpoints = server.state_dir.resolve() / "checkpoints"
    tags = run.data.tags
    assert tags["checkpoint/step-5"] == str(checkpoints / "step-5")
    assert tags["checkpoint/latest"] == tags[f"checkpoint/step-{steps[-1].step}"] == str(
        checkpoints / f"step-{steps[-1].step}")  # the stop's checkpoint
    assert "Traceback" not in server.log()


def test_an_unreachable_mlflow_is_spooled_and_replayed_when_a_server_starts_there(
        setup: Setup, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    server, uri = setup.dead, f"http://127.0.0.1:{setup.dead_port}"
    mlflow_server: subprocess.Popen[bytes] | None = None
    try:
        with SwarmClient(server.url, token=server.token) as client:
            with study_run(LETTERS / "client.py", server, tmp_path / "run.log", RUN_ARGS):
                wait_for(lambda: len(client.metrics()) >= 5 and "unreachable" in server.log(), 120,
                         what="5 steps trained while MLflow is unreachable", interval=0.25)
                booting = time.monotonic()
                mlflow_server = _start_mlflow_server(setup.dead_store, setup.dead_port, tmp_path)
                boot_s = time.monotonic() - booting
                unreachable_steps = len(client.metrics())  # trained before anything listened on the port
                mlflow = MlflowClient(tracking_uri=uri)
                wait_for(lambda: _delivered(mlflow, "spooled") >= unreachable_steps, 90,
                         what="the spooled steps to arrive", interval=0.25)
            steps = _pause_and_read(client)
        _swarm_stop(server)
        run = _the_run(mlflow, "spooled")
        assert run.info.status == "FINISHED"
        _assert_every_step_once(mlflow, run.info.run_id, steps)
    finally:
        _stop_mlflow_server(mlflow_server)
    print(f"mlflow server ready in {boot_s:.1f} s; {unreachable_steps} of {len(steps)} steps trained while "
          "MLflow was unreachable", file=sys.stderr)
    assert "reachable again" in server.log()


def test_a_server_that_cannot_start_ends_its_run_failed_with_the_reason(tmp_path: Path) -> None:
    """In process: the app of `swarm serve --engine vllm --vllm-url <nothing there>` fails in its start-up."""
    from fastapi.testclient import TestClient
    from mlflow.tracking import MlflowClient

    from swarm.backends import load_backend
    from swarm.backends.vllm import VllmGenerator, VllmStartError
    from swarm.models.resolve import resolve_model_folder
    from swarm.server import ServerSettings, create_app

    db = tmp_path / "mlflow.db"
    _create_tables(db)  # a stop waits 10 s at most for MLflow: on a busy machine a new store can take longer
    settings = ServerSettings(model="tiny", engine="vllm", state_dir=tmp_path / "state", token="t" * 32,
                              mlflow_uri=f"sqlite:///{db}", mlflow_experiment="failed")
    generator = VllmGenerator.attach(f"http://127.0.0.1:{free_port()}", resolve_model_folder("tiny"),
                                     settings.state_dir, model_name="tiny", start_timeout=0.5)
    app = create_app(settings, load_backend("tiny", settings.config), generator=generator)
    with pytest.raises(VllmStartError), TestClient(app):
        pass
    run = _the_run(MlflowClient(tracking_uri=f"sqlite:///{db}"), "failed")
    assert run.info.status == "FAILED"
    assert run.data.tags["swarm.error"].startswith("the server could not start: the vLLM server at")


def _create_tables(db: Path) -> None:
    """A new SQLite store, as `mlflow server` would create it (first open: 5-15 s here)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()


def _delivered(client: Any, experiment: str) -> int:
    """How many steps of train/reward_mean the experiment's run holds (0 before it exists)."""
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    return len({m.step for m in client.get_metric_history(runs[0].info.run_id, "train/reward_mean")}) if runs else 0


def _start_mlflow_server(db: Path, port: int, folder: Path, timeout_s: float = 180.0) -> subprocess.Popen[bytes]:
    """A real `mlflow server` on 127.0.0.1:``port`` over the SQLite file, in its own process group."""
    log_path = folder / "mlflow-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(MLFLOW_CLI), "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).is_success
        except httpx.TransportError:
            return False

    try:
        wait_for(healthy, timeout_s, what=f"mlflow server on port {port} to answer /health", interval=0.25,
                 proc=proc, log=log_path)
    except BaseException:
        _stop_mlflow_server(proc)
        raise
    return proc


def _stop_mlflow_server(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM to its process group (the server and its uvicorn worker), SIGKILL if it lingers."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
