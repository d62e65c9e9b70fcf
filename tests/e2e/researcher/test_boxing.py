"""Study code runs boxed and credentials stay secret (issue 14), with real processes throughout.

The end-to-end test runs `researcher start` (own `swarm serve` + `swarm run` processes, tiny model,
MLflow SQLite store) with fake secrets in the researcher's environment and, while a run trains,
checks the run's client process from /proc, runs a hanging smoke client against the run's server
(its grandchild must die with it), then stops the study and reads the MLflow artifacts. The other
tests are unit-level: the import check through the real validate node, old run.json files, study
ids and override keys.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import tomllib
from pathlib import Path

import pytest
from support import wait_for

from researcher.findings.records import IterationPlan
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from researcher.runs import detached, sandbox
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.runs.sandbox import Limits, check_client
from researcher.session.context import StudyContext
from researcher.session.nodes import validate, write_client
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout, check_study_id
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings, StudyOptions
from swarm import box

REPO = Path(__file__).resolve().parents[3]
LETTERS = REPO / "studies" / "examples" / "letters"
SECRETS = {"OPENAI_API_KEY": "sk-box-test-openai", "AWS_ACCESS_KEY_ID": "AKIABOXTEST",
           "AWS_SECRET_ACCESS_KEY": "box-test-aws-secret", "MLFLOW_TRACKING_TOKEN": "box-test-mlflow-token"}
ALLOWED_ENV = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "HOME", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "PYTHONUNBUFFERED", "SWARM_CLIENT_TOKEN"}
# A study client that escapes the import check (it is run directly, as if the check had missed it):
# it records its environment and limits, leaves a `sleep 1000` grandchild, then hangs.
# It reports what it sees on stdout (the smoke keeps the client's output; a boxed client's run folder is a
# private tmpfs that ends with it), tries to start a grandchild (the OS sandbox executes nothing; unboxed,
# the smoke's timeout must end it with the client's process group), then hangs.
HANGING_CLIENT = '''
import json, pathlib, os, subprocess, time
print("ENVIRON " + json.dumps(dict(os.environ)), flush=True)
print("LIMITS " + json.dumps(pathlib.Path("/proc/self/limits").read_text()), flush=True)
try:
    print(f"SLEEPER {subprocess.Popen(['sleep', '1000']).pid}", flush=True)
except OSError as exc:
    print(f"NO SLEEPER {exc}", flush=True)
time.sleep(1000)
def tasks(seed): yield {"task_id": "never"}
def workflow(ep, task): return 0.0
'''


def _reported(log: str, marker: str) -> str:
    return next(line.split(" ", 1)[1] for line in log.splitlines() if line.startswith(marker + " "))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def _limits(text: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in text.splitlines()[1:]:
        name, soft, hard = line[:26].strip(), *line[26:].split()[:2]
        rows[name] = (soft, hard)
    return rows


def _assert_boxed_env(env: dict[str, str], home: Path, client_token: str, box_adds: frozenset[str] = frozenset()) -> None:
    assert set(env) <= ALLOWED_ENV | box_adds, sorted(set(env) - ALLOWED_ENV)
    assert not any(k.startswith(("AWS_", "MLFLOW_", "OPENAI")) for k in env), sorted(env)
    assert env["HOME"] == str(home) and env["SWARM_CLIENT_TOKEN"] == client_token
    assert not any(secret in "".join(env.values()) for secret in SECRETS.values())


def _assert_limits(text: str, limits: Limits) -> None:
    rows = _limits(text)
    assert rows["Max cpu time"] == (str(limits.cpu_s), str(limits.cpu_s + 10))
    assert rows["Max address space"] == (str(limits.address_space),) * 2
    assert rows["Max file size"] == (str(limits.file_size),) * 2
    assert rows["Max open files"] == (str(limits.open_files),) * 2
    assert rows["Max core file size"] == ("0", "0")


class CmdlineWatch:
    """Collects the command line of every process on the machine, a few times a second."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for file in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    self.seen.add(file.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            self._stop.wait(0.2)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_researcher_run_is_boxed_and_keeps_tokens_off_argv_and_mlflow(cli, tmp_path: Path, monkeypatch) -> None:
    cli.env.update(SECRETS)
    for key, value in SECRETS.items():  # the in-test smoke below runs from this process's environment
        monkeypatch.setenv(key, value)
    sid = "box-study"
    runs_dir = cli.artifacts / sid / "runs"
    with CmdlineWatch() as watch:
        proc = cli.popen("start", "--topic", "group size on letters", "--budget", "10m", "--study-id", sid,
                         "--steps-per-run", "1000", "--seeds", "1", "--max-runs", "2", "--parallel", "1", *cli.dirs,
                         log=tmp_path / "start.log")
        try:
            wait_for(lambda: any(detached.alive(r.client_pid) for r in runs.all_records(runs_dir)), 240,
                     what="a run to start its client", log=tmp_path / "start.log", interval=0.2)
            record = next(r for r in runs.all_records(runs_dir) if r.client_pid)
            run_dir = runs_dir / f"{record.iteration:02d}-{record.trial:02d}"
            state_dir = Path(record.state_dir)
            control = (state_dir / "token").read_text().strip()
            client_token = (state_dir / "client_token").read_text().strip()

            # A hanging smoke client against the run's server (in the background: its timeout is the test).
            smoke_dir = tmp_path / "smoke"
            client = tmp_path / "hanging" / "client.py"
            client.parent.mkdir()
            client.write_text(HANGING_CLIENT)
            launcher = Launcher(ResearcherSettings().swarm_command, external_token=control)
            smoke: dict[str, str | None] = {}
            smoking = threading.Thread(target=lambda: smoke.update(error=launcher.smoke(
                client, LETTERS / "config.toml", smoke_dir, episodes=4, group_size=2, timeout_s=8.0,
                server_url=record.url)))
            smoking.start()

            # The training run's client: allow-listed environment with the client token only, and limits.
            _assert_boxed_env(_environ(record.client_pid), run_dir, client_token)
            _assert_limits(Path(f"/proc/{record.client_pid}/limits").read_text(), Limits.for_episodes(record.episodes))

            smoking.join(timeout=90)  # the smoke ends at its 8 s timeout
            stopped = cli.run("stop", sid, *cli.dirs)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert proc.wait(timeout=180) == 0, (tmp_path / "start.log").read_text()[-2000:]
        finally:
            if proc.poll() is None:  # a failed check: end the researcher and the runs it left detached
                proc.kill()
                proc.wait()
                for left in runs.all_records(runs_dir):
                    detached.stop_group(left.client_pid, left.client_started, grace_s=1.0)
                    detached.stop_group(left.server_pid, left.server_started, grace_s=1.0)

    # The hanging smoke ended at its timeout with its whole process group: in the OS sandbox its grandchild
    # never started; unboxed, it ended with the group.
    assert "did not finish within 8 s" in (smoke.get("error") or ""), smoke
    log = (smoke_dir / "client.log").read_text()
    if box.missing() is None:
        assert "NO SLEEPER" in log and "sandbox violation: started a subprocess (sleep)" in log, log[-2000:]
    else:
        sleeper = int(_reported(log, "SLEEPER"))
        wait_for(lambda: not detached.alive(sleeper), 10, what=f"grandchild sleep {sleeper} to end with the smoke "
                 "timeout", interval=0.2)
    inside = frozenset({"PWD", "TMPDIR"}) if box.missing() is None else frozenset()  # the box's folder and temp dir
    _assert_boxed_env(json.loads(_reported(log, "ENVIRON")), smoke_dir, control, inside)
    _assert_limits(json.loads(_reported(log, "LIMITS")), Limits.for_episodes(4))

    # Every token any server of the study wrote (smoke and runs): on no command line, in no run.json.
    tokens = {f.read_text().strip() for f in cli.artifacts.rglob("*token") if f.is_file()}
    assert control in tokens and client_token in tokens and len(tokens) >= 4  # smoke + run server, two each
    leaked = [(t[:6], line[:200]) for line in watch.seen for t in tokens if t in line]
    ours = [line for line in watch.seen if str(tmp_path) in line]  # other tests may run on this machine
    assert not leaked and any(" serve " in line for line in ours) and any(" run " in line for line in ours), leaked
    assert not any("--token" in line for line in ours)
    for run_json in runs_dir.glob("*/run.json"):
        assert "token" not in json.loads(run_json.read_text()) and not any(t in run_json.read_text() for t in tokens)

    # Credentials on disk: run and state dirs 0700, token files 0600.
    assert (run_dir.stat().st_mode & 0o777, state_dir.stat().st_mode & 0o777) == (0o700, 0o700)
    assert {(f.stat().st_mode & 0o777) for f in cli.artifacts.rglob("*token")} == {0o600}

    # MLflow: the run's artifact run/run.json holds no token (nor does anything else uploaded).
    from mlflow import MlflowClient

    mlflow = MlflowClient(tracking_uri=f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}")
    local = Path(mlflow.download_artifacts(runs.load(run_dir).mlflow_run_id, "run", str(tmp_path / "downloaded")))
    uploaded = {f.name: f.read_text(errors="replace") for f in local.iterdir()}
    assert "run.json" in uploaded and "token" not in json.loads(uploaded["run.json"])
    assert not any(t in text for t in tokens for text in uploaded.values())
    assert not any(name in uploaded for name in ("token", "client_token", "secret"))
    # A whole run dir logged as a folder leaves the server's credential files out.
    run_id = runs.load(run_dir).mlflow_run_id
    Tracker(f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}", cli.artifacts / "mlartifacts").log_files(
        run_id, [run_dir], "rundir")
    names = {Path(f.path).name for f in mlflow.list_artifacts(run_id, "rundir/server")}
    assert "buffer.db" in names and not names & {"token", "client_token", "secret"}, names


def test_import_check_fails_validation_before_the_client_runs(tmp_path: Path) -> None:
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts").resolved()
    layout = StudyLayout("box-check", settings.studies_root, settings.artifacts_root)
    ctx = StudyContext(settings=settings, layout=layout, planner=OfflinePlanner(["letters"]),
                       tracker=Tracker(settings.mlflow_uri(), settings.mlflow_artifact_root()),
                       launcher=Launcher(settings.swarm_command))
    marker = tmp_path / "it-ran"
    example = (LETTERS / "client.py").read_text()
    line = len(example.splitlines()) + 1
    plan = IterationPlan.model_validate({"experiments": [{"name": "e1", "hypothesis": "h1", "overrides": {}}]})
    studyfiles.write_plan(layout, 1, plan, {})
    studyfiles.write_experiment(layout, "e1", f"{example}import subprocess\nopen({str(marker)!r}, 'w').write('x')\n",
                                {"group_size": 2}, "h1")
    state = {"iteration": 1, "options": {"smoke_episodes": 2, "smoke_timeout_s": 30.0}, "budget": {"max_repairs": 3},
             "validation": None}

    result = validate.validate(state, ctx)  # type: ignore[arg-type]

    error = result["validation"]["error"]
    assert result["phase"] == "writing" and result["validation"]["ok"] is False  # back to the repair round
    assert f"client.py:{line}: `import subprocess`: subprocess is not an allowed module" in error
    assert f"client.py:{line + 1}: `open` is not allowed" in error
    assert not marker.exists() and not layout.smoke_dir(1, 1).exists()  # nothing ran, no smoke server started
    assert "FAILED: client.py failed the import check: 2 violation(s)" in layout.log_md.read_text()
    # The example clients (what the planner starts from) pass the check.
    assert all(check_client(p.read_text()) is None for p in (REPO / "studies" / "examples").glob("*/client.py"))


def test_old_run_json_with_a_token_loads_without_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "01-00"
    run_dir.mkdir(parents=True)
    old = {"key": "s/1/0", "study_id": "s", "iteration": 1, "trial": 0, "experiment": "e", "seed": 0, "config": {},
           "client": "client.py", "target_step": 8, "episodes": 64, "group_size": 8, "status": "parked",
           "url": "http://127.0.0.1:1", "token": "old-control-token", "launches": 1}
    (run_dir / "run.json").write_text(json.dumps(old))

    record = runs.load(run_dir)

    assert record is not None and record.status == "parked" and not hasattr(record, "token")
    token_file = Path(record.state_dir) / "token"
    assert token_file.read_text() == "old-control-token" and token_file.stat().st_mode & 0o777 == 0o600
    assert Launcher(["swarm"]).control_token(record) == "old-control-token"  # the restarted server reuses it
    runs.save(run_dir, record)  # the launcher's next save drops it from run.json
    assert "old-control-token" not in (run_dir / "run.json").read_text()
    assert run_dir.stat().st_mode & 0o777 == 0o700 and token_file.parent.stat().st_mode & 0o777 == 0o700
    external = {**old, "external": True, "token": "external-token"}
    (run_dir / "run.json").write_text(json.dumps(external))
    assert runs.load(run_dir).external and token_file.read_text() == "old-control-token"


def test_a_plan_with_a_bad_override_key_fails_the_study_before_anything_is_written(tmp_path: Path) -> None:
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=REPO / "studies" / "examples").resolved()
    layout = StudyLayout("box-keys", settings.studies_root, settings.artifacts_root)
    planner = OfflinePlanner(["letters"])
    ctx = StudyContext(settings=settings, layout=layout, planner=planner,
                       tracker=Tracker(settings.mlflow_uri(), settings.mlflow_artifact_root()),
                       launcher=Launcher(settings.swarm_command))
    framing = planner.frame("group size on letters", catalog.describe(settings.examples_root)).value
    bad = {"name": "e1", "hypothesis": "h1", "overrides": {"lr = 1\n[evil]\nx": 2}}
    studyfiles.write_plan(layout, 1, IterationPlan.model_validate({"experiments": [bad]}), framing.model_dump())
    state = {"iteration": 1, "framing": framing.model_dump(), "validation": None,
             "options": StudyOptions().model_dump()}

    result = write_client.write(state, ctx)  # type: ignore[arg-type]

    assert result["phase"] == "failed" and "invalid config override key" in result["error"]
    assert not layout.experiment_dir("e1").exists()
    assert validate.validate({**state, **result}, ctx) == {}  # validate hands the failed study on to the report


def test_study_ids_and_override_keys_are_validated(tmp_path: Path) -> None:
    assert check_study_id("ok-1.b_c") == "ok-1.b_c"
    for bad in ("ok\n", "ok\r", "a..b", "Upper", "", "x" * 81):
        with pytest.raises(ValueError, match="invalid study id"):
            check_study_id(bad)

    config = LETTERS / "config.toml"
    assert studyfiles.server_config(config, {"group_size": 2})["group_size"] == 2
    for bad in ('lr = 1\n[evil]\nx', "a.b", "Group", "x y", ""):
        with pytest.raises(ValueError, match="invalid config override key"):
            studyfiles.server_config(config, {bad: 1})
    # Whatever keys reach the writer stay single keys: quoted when not bare-safe, never a table.
    text = studyfiles.dumps_toml({"lr": 0.1, 'x = 1\n[evil]\ny': 2, "a.b": {"c]\n[d": 3}})
    assert tomllib.loads(text) == {"lr": 0.1, 'x = 1\n[evil]\ny': 2, "a.b": {"c]\n[d": 3}}
    assert "\n[evil]" not in text and text.startswith("lr = 0.1\n")


def test_limits_are_enforced_and_named(tmp_path: Path) -> None:
    """Each limit bites (memory, file size and open files raise in Python; CPU kills) in a real process."""
    script = """
import sys
try:
    bytearray(512 << 20)
except MemoryError:
    print("memory capped", flush=True)
try:
    open("big", "wb").write(b"x" * (2 << 20))
except OSError as exc:
    print("file capped:", exc.strerror, flush=True)
try:
    files = [open(sys.executable, "rb") for _ in range(100)]
except OSError as exc:
    print("files capped:", exc.strerror, flush=True)
while True:
    pass
"""
    limits = Limits(cpu_s=1, address_space=256 << 20, file_size=1 << 20, open_files=64)
    done = sandbox.run_boxed([sys.executable, "-c", script], env=sandbox.study_env(tmp_path, client_token=None),
                             cwd=tmp_path, limits=limits, timeout_s=60)
    assert done.output.splitlines() == ["memory capped", "file capped: File too large",
                                        "files capped: Too many open files"], done.output
    assert done.describe() == "was killed by SIGXCPU (it reached its CPU time limit)"
    assert (tmp_path / "big").stat().st_size == 1 << 20
