"""Soak: a real study under seeded random SIGKILLs of every process kind; nothing lost, the same answer.

    tests/soak/soak.py --duration 2h --seed S [--engine torch|vllm] [--pool-workers N] [--fill-disk]

What runs (all on loopback, under one temp dir, every process in its own session):
- an ``mlflow server`` (SQLite backend in the temp dir), the tracking URI of everything below;
- ``researcher daemon`` with the study scheduled every ``--every`` seconds (``researcher schedule``):
  a session it finds not running (the study's lock free) is resumed by its schedule;
- studies back to back until ``--duration`` has passed, each ``researcher start`` of the same topic
  and seeds (offline planner, the tiny model), whose runs are ``swarm serve`` + ``swarm run``
  processes; with ``--pool-workers N`` the soak (as a user would) keeps N ``swarm worker`` processes
  in each live run's pool. ``--engine vllm``: every run's server and worker generates with vLLM (the
  researcher reads ``engine = "vllm"`` from the soak's copy of the examples' config.toml; the soak
  stops at once, saying how to install it, where ``.venv-vllm`` or ``$SWARM_VLLM_PYTHON`` is missing).
- with ``--fill-disk``, the studies' artifacts folder is a tmpfs that is filled to the last byte at
  seeded random times and freed after a while (``soak_disk``): servers answer 507 and sessions park.

The chaos loop waits a seeded random interval, then SIGKILLs one process of a kind drawn from a
seeded shuffle of the kinds present (each kind once per round): ``client``, ``server``, ``worker``,
``researcher``, ``daemon``, ``mlflow`` (its whole process group). What supervises a process brings it
back: the researcher restarts clients and servers, the daemon's schedule resumes a killed researcher.
The soak restarts only what a user restarts by hand, and logs each: the daemon, the MLflow server,
every other killed researcher (``researcher resume``; the others are left to the schedule) and pool
workers.

Before the chaos, the same study runs once undisturbed (its own SQLite MLflow): the reference
Answer. At the end one line, then the kill counts per kind::

    RESULT soak_s=… kills=… lost=… twice=… duplicate_runs=… mlflow_gaps=… orphans=… rss_growth_mb=… verdict_equal=0|1
           disk_full_events=…

(on one line; ``soak_audit`` says how each is counted, ``soak_disk`` how ``disk_full_events`` is: the
full-disk spells a server or a study reported). Exit status 0 when every counter is 0 and verdict_equal=1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE), str(REPO / "tests")]  # support.disks: the soak's disk filler

import soak_audit as audit_  # noqa: E402
import soak_chaos as chaos  # noqa: E402
import soak_disk  # noqa: E402

from researcher.runs import detached  # noqa: E402
from researcher.study import store  # noqa: E402
from researcher.study.flags import parse_duration  # noqa: E402
from researcher.study.layout import StudyLayout  # noqa: E402
from researcher.tracking.spool import Spool  # noqa: E402
from swarm import ports  # noqa: E402

TOPIC = "Does a learning rate of 3e-3 beat 3e-5 on letters?"
ENDED = ("done", "failed", "stopped")


def _say(line: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {line}", flush=True)


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        self.rng = random.Random(args.seed)
        self.marker = f"soak-{os.getpid()}-{args.seed}"
        self.studies, self.artifacts = root / "studies", root / "artifacts"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True)
        self.mlflow_port = ports.free_port()
        self.mlflow_uri = f"http://127.0.0.1:{self.mlflow_port}"
        self.mlflow: subprocess.Popen | None = None
        self.daemon: subprocess.Popen | None = None
        self.mine: list[subprocess.Popen] = []  # researcher processes the soak started (reaped as they end)
        self.workers: dict[tuple[str, str, int], subprocess.Popen] = {}  # (run key, url, slot) -> worker
        self.kills: dict[str, int] = {}
        self.restarts: dict[str, int] = {}
        self.researcher_kills = 0
        self.round: list[str] = []  # the kinds this round of kills has yet to hit
        self.pending: list[tuple[float, str]] = []  # (due time, what to restart by hand)
        self.memory = chaos.MemoryLog()
        self.study_ids: list[str] = []
        self.launched = 0
        self.cwd = _examples_for(args.engine, root)  # where the researcher finds studies/examples
        self.disk = soak_disk.DiskChaos(self.artifacts, args.disk_mb, random.Random(args.seed + 1), args.fill_every,
                                        args.fill_hold, _say) if args.fill_disk else None

    # ------------------------------------------------------------------ processes

    def env(self, mlflow: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RESEARCHER_LLM", "MLFLOW_TRACKING")) and k not in ("OPENAI_API_KEY", "SWARM_TOKEN")}
        env.update({"PYTHONPATH": str(REPO), "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1",
                    "WANDB_DISABLED": "true", "COLUMNS": "200", chaos.MARKER_ENV: self.marker})
        if mlflow:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_uri
        return env

    def spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.logs / log_name, "ab") as out:
            return subprocess.Popen(argv, cwd=self.cwd, env=env or self.env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def researcher(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "researcher.cli", *args]

    def dirs(self, studies: Path | None = None, artifacts: Path | None = None) -> list[str]:
        return ["--studies-dir", str(studies or self.studies), "--artifacts-dir", str(artifacts or self.artifacts)]

    def start_mlflow(self) -> None:
        db = self.root / "mlflow" / "mlflow.db"
        db.parent.mkdir(exist_ok=True)
        self.mlflow = self.spawn([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                                  "--default-artifact-root", (self.root / "mlflow" / "artifacts").as_uri(),
                                  "--host", "127.0.0.1", "--port", str(self.mlflow_port), "--workers", "1"],
                                 "mlflow.log", env=self.env(mlflow=False))

    def mlflow_up(self, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.mlflow_uri}/health", timeout=2).status_code == 200:
                    return
            if self.mlflow is not None and self.mlflow.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.logs / 'mlflow.log').read_text()[-2000:]}")
            time.sleep(0.5)
        raise RuntimeError("mlflow server did not answer")

    def start_daemon(self) -> None:
        self.daemon = self.spawn(self.researcher("daemon", *self.dirs(), "--poll", "2", "--port", "0"), "daemon.log")

    def study_argv(self, study_id: str, studies: Path | None = None, artifacts: Path | None = None) -> list[str]:
        a = self.args
        return self.researcher("start", "--topic", a.topic, "--budget", a.budget, "--study-id", study_id,
                               "--steps-per-run", str(a.steps), "--seeds", str(a.seeds), "--parallel", str(a.parallel),
                               "--max-iterations", "1", "--seed-base", str(a.seed),
                               *self.dirs(studies, artifacts))

    # ------------------------------------------------------------------ the reference

    def reference(self) -> str | None:
        """The same study, undisturbed, on its own SQLite MLflow: its Answer's class."""
        studies, artifacts = self.root / "ref" / "studies", self.root / "ref" / "artifacts"
        started = time.time()
        proc = self.spawn(self.study_argv("reference", studies, artifacts), "reference.log", env=self.env(mlflow=False))
        code = proc.wait()
        verdict, text = audit_.answer(StudyLayout("reference", studies.resolve(), artifacts.resolve()))
        _say(f"reference study: exit {code} in {time.time() - started:.0f} s, Answer class {verdict!r}: {text[:160]}")
        return verdict

    # ------------------------------------------------------------------ the chaos

    def layout(self, study_id: str) -> StudyLayout:
        return StudyLayout(study_id, self.studies.resolve(), self.artifacts.resolve())

    def phase(self, study_id: str) -> str | None:
        try:
            return (store.read_state(self.layout(study_id)) or {}).get("phase")
        except Exception:  # a read racing the writer: ask again at the next tick
            return None

    def present(self) -> dict[str, list[chaos.Target]]:
        clients, servers = chaos.run_processes([self.layout(s).runs_dir for s in self.study_ids])
        kinds = {"client": clients, "server": servers,
                 "researcher": chaos.researchers(set(self.study_ids)),
                 "daemon": chaos.of_popen("daemon", self.daemon),
                 "mlflow": chaos.of_popen("mlflow", self.mlflow, group=True)}
        if self.args.pool_workers:
            kinds["worker"] = [t for p in self.workers.values() for t in chaos.of_popen("worker", p)]
        return {k: v for k, v in kinds.items() if v}

    def kinds(self) -> list[str]:
        return ["client", "server", "researcher", "daemon", "mlflow", *(["worker"] if self.args.pool_workers else [])]

    def missing_kinds(self) -> list[str]:
        """With ``--every-kind``: the kinds not killed yet (the chaos goes on past the duration until none)."""
        return [k for k in self.kinds() if k not in self.kills] if self.args.every_kind else []

    def pick(self, now: dict[str, list[chaos.Target]]) -> str | None:
        """The next kind of this round (a seeded shuffle of every kind) that is present now; a kind that
        is absent (no run is live: no client) keeps its place until it is. Every kind is killed once a
        round before any is killed twice."""
        if not self.round:
            self.round = self.kinds()
            self.rng.shuffle(self.round)
        kind = next((k for k in self.round if k in now), None)
        if kind is not None:
            self.round.remove(kind)
        return kind

    def kill_one(self) -> bool:
        """SIGKILL one process of the round's next kind present; False when none is (try again soon)."""
        now = self.present()
        kind = self.pick(now)
        if kind is None:
            return False
        target = self.rng.choice(now[kind])
        if not chaos.kill(target):
            self.round.append(kind)  # it ended by itself meanwhile: the kind keeps its turn
            return False
        self.kills[kind] = self.kills.get(kind, 0) + 1
        _say(f"SIGKILL {kind} pid {target.pid} {target.what}".rstrip())
        if kind == "daemon":
            self.pending.append((time.time() + self.rng.uniform(2, 10), "daemon"))
        elif kind == "mlflow":
            self.pending.append((time.time() + self.rng.uniform(3, 20), "mlflow"))
        elif kind == "researcher":
            self.researcher_kills += 1
            if self.researcher_kills % 2:  # every other one the user resumes; the rest the daemon's schedule does
                self.pending.append((time.time() + self.rng.uniform(1, 5), "researcher"))
            else:
                _say("left to the daemon's schedule")
        return True

    def restart_due(self, study_id: str) -> None:
        now = time.time()
        for item in [p for p in self.pending if p[0] <= now]:
            self.pending.remove(item)
            what = item[1]
            if what == "daemon":
                self.start_daemon()
            elif what == "mlflow":
                self.start_mlflow()
            elif what == "researcher":
                if self.phase(study_id) in ENDED:
                    continue
                self.mine.append(self.spawn(self.researcher("resume", study_id, *self.dirs()), f"{study_id}.log"))
            self.restarts[what] = self.restarts.get(what, 0) + 1
            _say(f"restarted by hand: {what}")

    def keep_workers(self) -> None:
        """A user's pool: N ``swarm worker`` processes per live run server (restarted when one dies)."""
        if not self.args.pool_workers:
            return
        from researcher.runs import record as runs

        live = set()
        for study_id in self.study_ids:
            for record in runs.all_records(self.layout(study_id).runs_dir):
                if record.status != "running" or not detached.alive(record.server_pid, record.server_started):
                    continue
                token_file = Path(record.state_dir) / "worker_token"
                if not token_file.is_file():
                    continue
                for slot in range(self.args.pool_workers):
                    key = (record.key, record.url, slot)
                    live.add(key)
                    proc = self.workers.get(key)
                    if proc is not None and proc.poll() is None:
                        continue
                    if proc is not None:
                        self.restarts["worker"] = self.restarts.get("worker", 0) + 1
                        _say(f"restarted by hand: worker {slot} of {record.key}")
                    env = {**self.env(), "SWARM_WORKER_TOKEN": token_file.read_text().strip()}
                    self.workers[key] = self.spawn([sys.executable, "-m", "swarm.cli", "worker", "--server", record.url,
                                                    "--engine", self.args.engine, "--port", "0"],
                                                   f"worker-{record.key.replace('/', '_')}-{slot}.log", env=env)
        for key in [k for k in self.workers if k not in live]:
            self.stop(self.workers.pop(key))

    def reap(self) -> None:
        self.mine = [p for p in self.mine if p.poll() is None]

    def researcher_running(self, study_id: str) -> bool:
        return bool(chaos.researchers({study_id}))

    def run_study(self, study_id: str, chaos_until: float) -> None:
        self.study_ids.append(study_id)
        starting = self.spawn(self.study_argv(study_id), f"{study_id}.log")
        self.mine.append(starting)
        layout = self.layout(study_id)
        while not layout.graph_db.is_file():
            if starting.poll() is not None:
                raise RuntimeError(f"`researcher start` exited {starting.returncode}: see {self.logs / study_id}.log")
            time.sleep(0.5)
        subprocess.run(self.researcher("schedule", study_id, "--every", f"{self.args.every:g}s", "--window", "6h",
                                       *self.dirs()), cwd=self.cwd, env=self.env(), check=True, capture_output=True)
        next_kill = time.time() + self.rng.uniform(*self.args.interval)
        quiet_since = None
        while self.phase(study_id) not in ENDED:
            self.reap()
            self.restart_due(study_id)
            self.keep_workers()
            if self.disk is not None:
                self.disk.tick([self.layout(s).runs_dir for s in self.study_ids],
                               [self.layout(s).artifacts_dir / "events.jsonl" for s in self.study_ids])
            if int(time.time()) % 5 == 0:  # every ~5 s: a scan of /proc costs CPU the study needs
                now_present = self.present()
                self.memory.sample([t for k in ("daemon", "mlflow", "researcher") for t in now_present.get(k, [])])
            now = time.time()
            if now >= next_kill and (now < chaos_until or self.missing_kinds()):
                if self.kill_one():  # else the kinds left in this round are absent: retry at the next tick
                    next_kill = now + self.rng.uniform(*self.args.interval)
            # A safety net, counted apart: no researcher for 3 schedule periods and none pending.
            if self.researcher_running(study_id) or any(w == "researcher" for _, w in self.pending):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since > 3 * self.args.every + 30:
                _say("no researcher for a while: resuming by hand (safety net)")
                self.restarts["researcher-safety"] = self.restarts.get("researcher-safety", 0) + 1
                self.mine.append(self.spawn(self.researcher("resume", study_id, *self.dirs()), f"{study_id}.log"))
                quiet_since = None
            time.sleep(1.0)
        _say(f"study {study_id}: {self.phase(study_id)}")
        if self.disk is not None:
            self.disk.end()  # the next study starts with room (a start on a full disk keeps nothing)
        deadline = time.time() + 120  # the session that wrote the report exits by itself (after its spool)
        while self.researcher_running(study_id) and time.time() < deadline:
            self.reap()
            time.sleep(1.0)
        subprocess.run(self.researcher("unschedule", study_id, *self.dirs()), cwd=self.cwd, env=self.env(),
                       capture_output=True)

    # ------------------------------------------------------------------ the end

    def bring_back(self) -> None:
        """Before the checks: what the chaos left down comes back (MLflow holds the evidence)."""
        if self.disk is not None:
            self.disk.end()
        for _, what in self.pending:
            if what == "mlflow":
                self.start_mlflow()
        self.pending.clear()
        if self.mlflow is None or self.mlflow.poll() is not None:
            self.start_mlflow()
        self.mlflow_up()
        for study_id in self.study_ids:  # what a study ended with in its spool: the resume its LOG.md names
            if Spool(self.layout(study_id).artifacts_dir / "mlflow_spool").pending():
                self.restarts["researcher-spool"] = self.restarts.get("researcher-spool", 0) + 1
                _say(f"{study_id} ended with MLflow writes spooled: `researcher resume {study_id}` by hand")
                subprocess.run(self.researcher("resume", study_id, *self.dirs()), cwd=self.cwd, env=self.env(),
                               capture_output=True, timeout=600)

    @staticmethod
    def stop(proc: subprocess.Popen | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def shutdown(self) -> None:
        for proc in [*self.workers.values(), self.daemon, *self.mine]:
            self.stop(proc)
        self.stop(self.mlflow)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="2h", help="keep starting studies under chaos this long (e.g. 4m, 2h)")
    parser.add_argument("--seed", type=int, default=0, help="the chaos' draws and every run's seed base")
    parser.add_argument("--engine", choices=["torch", "vllm"], default="torch",
                        help="what every run's server and pool worker generates with (vllm: needs .venv-vllm)")
    parser.add_argument("--pool-workers", type=int, default=0, help="swarm workers kept in each live run's pool")
    parser.add_argument("--ray", action="store_true", help="place runs on a local Ray cluster (not in this increment)")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--steps", type=int, default=20, help="steps per run (at 10 the Answer's class is not stable)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm (at 2 the Answer's class is not stable)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--budget", default="30m", help="each study's budget (a study ends well within it)")
    parser.add_argument("--every", type=float, default=15.0, help="the daemon's schedule period, seconds")
    parser.add_argument("--interval", type=float, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="seconds between kills, drawn uniformly (default 10-40 s; with --engine vllm 40-120 s: "
                        "each kind comes up about every sixth kill, and a run whose server restarts three times "
                        "without training a step ends crashed, which a vLLM restart of minutes made the rule)")
    parser.add_argument("--every-kind", action="store_true",
                        help="go on past the duration until every kind has been killed at least once")
    parser.add_argument("--fill-disk", action="store_true", help=(
        "the studies' artifacts on a tmpfs (needs root), filled at random times for a while, then freed"))
    parser.add_argument("--disk-mb", type=int, default=1024,
                        help="the tmpfs' size (above the researcher's own 500 MB disk watchdog)")
    parser.add_argument("--fill-every", type=float, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="seconds from one full-disk spell's end to the next one's start, drawn uniformly "
                        "(default 20-60 s; with --engine vllm 240-480 s: a vLLM run needs minutes to start "
                        "on 2 cores, and a study parks on each spell, so closer spells leave it no progress)")
    parser.add_argument("--fill-hold", type=float, nargs=2, default=(5.0, 20.0), metavar=("MIN", "MAX"),
                        help="seconds a full-disk spell lasts, drawn uniformly")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (printed) for a post-mortem")
    args = parser.parse_args(argv)
    if args.ray:
        parser.error("--ray is not part of this soak yet")
    if args.interval is None:
        args.interval = (40.0, 120.0) if args.engine == "vllm" else (10.0, 40.0)
    if args.fill_every is None:
        args.fill_every = (240.0, 480.0) if args.engine == "vllm" else (20.0, 60.0)
    if args.engine == "vllm":
        from swarm.backends.vllm.process import VllmStartError, find_vllm_python

        try:
            find_vllm_python()
        except VllmStartError as exc:
            parser.error(f"--engine vllm: {exc}")
    duration = parse_duration(args.duration)
    root = Path(tempfile.mkdtemp(prefix="soak-")).resolve()
    soak = Soak(args, root)
    started = time.time()
    _say(f"seed {args.seed}, duration {duration:.0f} s, root {root}")
    try:
        if soak.disk is not None:
            soak.disk.mount()
        reference = soak.reference()
        chaos_until = time.time() + duration
        soak.start_mlflow()
        soak.mlflow_up()
        soak.start_daemon()
        n = 0
        while True:
            n += 1
            soak.run_study(f"soak-{args.seed}-{n}", chaos_until)
            if time.time() >= chaos_until and not soak.missing_kinds():
                break
        soak.bring_back()
        result = check(soak, reference)
    finally:
        soak.shutdown()
        time.sleep(2.0)
        left = chaos.leftovers(root, soak.marker)
        chaos.kill_all(left)
        if soak.disk is not None:
            soak.disk.unmount()
    result["orphans"] = len(left)
    if left:
        _say(f"left behind: {json.dumps(left)}")
    result["soak_s"] = round(time.time() - started)
    result["disk_full_events"] = soak.disk.observed if soak.disk is not None else 0
    print("RESULT " + " ".join(f"{k}={result[k]}" for k in ("soak_s", "kills", "lost", "twice", "duplicate_runs",
                                                            "mlflow_gaps", "orphans", "rss_growth_mb",
                                                            "verdict_equal", "disk_full_events")), flush=True)
    print("KILLS " + " ".join(f"{k}={v}" for k, v in sorted(soak.kills.items())), flush=True)
    print("RESTARTED_BY_HAND " + " ".join(f"{k}={v}" for k, v in sorted(soak.restarts.items())), flush=True)
    if soak.disk is not None:
        print(f"DISK spells={soak.disk.spells} reported={soak.disk.observed}", flush=True)
    if args.keep:
        _say(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    ok = all(result[k] == 0 for k in ("lost", "twice", "duplicate_runs", "mlflow_gaps", "orphans")) \
        and result["verdict_equal"] == 1
    return 0 if ok else 1


def _examples_for(engine: str, root: Path) -> Path:
    """The working directory of the soak's researcher processes: the repository (its studies/examples),
    or for another engine than torch a folder holding a copy of them whose every config.toml names it
    (``engine`` is a key an experiment's config file may set; the researcher's runs inherit it)."""
    if engine == "torch":
        return REPO
    work = root / "work"
    shutil.copytree(REPO / "studies" / "examples", work / "studies" / "examples")
    for config in (work / "studies" / "examples").glob("*/config.toml"):
        config.write_text(f'engine = "{engine}"  # set by the soak (--engine)\n' + config.read_text())
    return work


def check(soak: Soak, reference: str | None) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=soak.mlflow_uri)
    audit = audit_.Audit()
    verdicts = []
    for study_id in soak.study_ids:
        layout = soak.layout(study_id)
        audit_.episodes(audit, layout.runs_dir)
        audit_.duplicate_runs(audit, layout.runs_dir, client, study_id)
        audit_.mlflow_steps(audit, layout.runs_dir, layout.artifacts_dir / "mlflow_spool", client)
        verdict, text = audit_.answer(layout)
        verdicts.append(verdict)
        _say(f"{study_id}: phase {soak.phase(study_id)}, Answer class {verdict!r}: {text[:160]}")
    for note in audit.notes:
        _say(f"FOUND {note}")
    _say(f"episodes acknowledged by clients {audit.acknowledged}, trained {audit.trained}")
    _say("largest memory growth: {1}".format(*soak.memory.worst()))
    return {"kills": sum(soak.kills.values()), "lost": audit.lost, "twice": audit.twice,
            "duplicate_runs": audit.duplicate_runs, "mlflow_gaps": audit.mlflow_gaps,
            "rss_growth_mb": soak.memory.growth_mb(),
            "verdict_equal": int(reference is not None and all(v == reference for v in verdicts))}


if __name__ == "__main__":
    sys.exit(main())
