"""Watchdogs against real failures: an OpenAI-protocol server out of quota, a disk threshold above
the free space, and an MLflow tracking URI pointing at a closed loopback port."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from support import free_port, wait_for

from researcher.planner.llm import LLMPlanner
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import QuotaExhausted
from researcher.session import runner, watchdogs
from researcher.session.composition import build_context, build_settings
from researcher.tracking.tracker import Tracker
from researcher.types import failures
from researcher.types.settings import LLMSettings, StudyOptions

REPO = Path(__file__).resolve().parents[3]
TOPIC = "Does a larger GRPO group size make the letters task learn faster?"
QUOTA_BODY = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}


@pytest.fixture
def quota_server() -> Iterator[tuple[str, list[dict]]]:
    """A real OpenAI-protocol HTTP server whose account is out of credit: every call is a 429
    insufficient_quota, exactly as api.openai.com answers it."""
    requests: list[dict] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        requests.append(await request.json())
        return JSONResponse(QUOTA_BODY, status_code=429)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, what="the quota server to start")
    try:
        yield f"http://127.0.0.1:{port}/v1", requests
    finally:
        server.should_exit = True
        thread.join(10)


def test_quota_error_is_not_transient_and_raises_quota_exhausted(quota_server) -> None:
    url, requests = quota_server
    planner = LLMPlanner(LLMSettings(base_url=url, model="m", max_retries=0), PromptLibrary(REPO / "prompts"))
    with pytest.raises(QuotaExhausted, match="out of quota or credit"):
        planner.frame("group size on letters?", "catalog")
    assert len(requests) == 1  # not retried: retrying cannot buy credit


@pytest.mark.slow
def test_quota_error_parks_the_study_instead_of_crashing(cli, quota_server) -> None:
    url, requests = quota_server
    cli.env.update({"RESEARCHER_LLM_BASE_URL": url, "RESEARCHER_LLM_MODEL": "m", "OPENAI_API_KEY": "sk-test"})
    done = cli.run("start", "--topic", TOPIC, "--study-id", "broke", "--budget", "10m", *cli.dirs, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parked" in done.stdout and "quota" in done.stdout
    log_md = (cli.studies / "broke" / "LOG.md").read_text()
    assert "Parked in phase framing" in log_md and "out of quota or credit" in log_md
    row = json.loads(cli.run("status", "broke", "--json", *cli.dirs).stdout)
    assert row["state"] == "parked" and row["active"] is False and not row["error"]
    assert requests  # the planner did call the endpoint


def test_disk_threshold_above_free_space_parks_with_a_clear_log_line(tmp_path: Path) -> None:
    settings = build_settings(tmp_path / "studies", tmp_path / "artifacts", env={})
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    options = StudyOptions(min_free_disk_mb=free_mb * 2 + 1024, steps_per_run=2, seeds=1)
    assert watchdogs.disk_low(tmp_path, options.min_free_disk_mb)
    assert watchdogs.disk_low(tmp_path, 1.0) is None
    ctx = build_context(settings, "full-disk", options)
    state = runner.start(ctx, TOPIC, options, time.time() + 600)
    assert state["phase"] == "parked" and state["parked"]["phase"] == "planning"
    assert "disk almost full" in state["parked"]["reason"]
    log_md = (tmp_path / "studies" / "full-disk" / "LOG.md").read_text()
    assert "Parked in phase planning" in log_md and "disk almost full" in log_md
    assert not (tmp_path / "artifacts" / "full-disk" / "runs").exists()  # nothing launched on a full disk


def test_a_write_the_disk_refused_is_recognised_as_a_full_disk(tmp_path: Path) -> None:
    """What the graph parks on (a ``disk_full`` event) instead of failing the node: a real ENOSPC from
    a filled tmpfs, a quota, SQLite's "disk is full", through a wrapping error; not other I/O errors."""
    import errno
    import sqlite3

    from support.disks import fill, small_disk

    with small_disk(tmp_path / "disk", 1) as disk:
        fill(disk)
        with pytest.raises(OSError) as refused:
            (disk / "LOG.md").write_text("x" * 65536)
    assert failures.is_disk_full(refused.value)
    wrapped = RuntimeError("saving the study state failed")
    wrapped.__cause__ = sqlite3.OperationalError("database or disk is full")
    wrapped.__cause__.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]  # as SQLite sets it
    assert failures.is_disk_full(wrapped) and failures.is_disk_full(OSError(errno.EDQUOT, "quota"))
    assert not failures.is_disk_full(OSError(errno.EACCES, "denied"))
    assert not failures.is_disk_full(sqlite3.OperationalError("database is locked"))


def test_mlflow_unreachable_spools_then_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    spool_dir = tmp_path / "study" / "mlflow_spool"
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    down = Tracker(closed, tmp_path / "mlartifacts", spool_dir)
    parent = down.start_parent("spooled", 1, {"researcher.task": "letters"})
    assert parent.startswith("local-")
    child = down.start_child("spooled", parent, "run-a", {"lr": 0.001}, {"researcher.run_key": "spooled/1/0"})
    down.log_values(child, {"train/reward_mean": 0.5}, step=3)
    (tmp_path / "note.txt").write_text("hello")
    down.log_files(parent, [tmp_path / "note.txt"], "review")
    down.end(child)
    assert down.spool.pending() == 6  # 2 creates, params, metrics, files, end: nothing lost, nothing raised

    # The store is back (here: the study's sqlite store): the next write replays the spool in order.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    up = Tracker(uri, tmp_path / "mlartifacts", spool_dir)
    assert up.flush(force=True) and up.spool.pending() == 0
    real_parent, real_child = up.real_id(parent), up.real_id(child)
    assert real_parent and real_child and not real_child.startswith("local-")
    run = up.client.get_run(real_child)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.001"
    assert run.data.tags["mlflow.parentRunId"] == real_parent
    assert [m.value for m in up.client.get_metric_history(real_child, "train/reward_mean")] == [0.5]
    assert [a.path for a in up.client.list_artifacts(real_parent, "review")] == ["review/note.txt"]
    up.log_values(child, {"train/reward_mean": 0.7}, step=4)  # later writes to the local id land in the real run
    assert len(up.client.get_metric_history(real_child, "train/reward_mean")) == 2
    assert up.flush(force=True)  # replaying again creates nothing twice
    assert len(up.client.search_runs([up.experiment_id("spooled")])) == 2
