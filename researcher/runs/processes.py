"""How a run's server and client processes are started and reached: their commands, environment
and credentials, and waiting for a server to answer. ``Launcher`` (``researcher.runs.launcher``) builds
on this with the run's record and lifecycle; the Ray launcher places the same commands on a cluster.

Credentials: our servers bind loopback without a token, so `swarm serve` generates its control
token and client token and keeps them in its state dir (``<run dir>/server/token`` and
``client_token``, 0600), reusing them when it restarts on that dir (a park, a crash). The launcher
reads them from there when it needs them: the files are the one copy, they survive a researcher
restart, and no token is ever on a command line or in run.json. The server's environment is ours
minus tokens and the MLflow URI; study code (`swarm run`) runs boxed (``researcher.runs.sandbox``) with
only the client token, by environment. External servers get the configured token the same way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from researcher.runs import detached, sandbox, shedding
from researcher.runs import record as runs
from researcher.runs.logs import LOG_KEEP, LOG_MAX_BYTES, SERVER_LOG, tail
from researcher.runs.record import RunRecord
from researcher.tracking.spool import LOCAL_PREFIX
from swarm.client import SwarmClient

log = logging.getLogger(__name__)

STATE_DIR = "server"  # the server's state dir inside the run dir
TOKEN_FILE, CLIENT_TOKEN_FILE = "token", "client_token"  # written there by `swarm serve`
# Never inherited by a server we start: it must make (or reuse) its own tokens, and the researcher
# is the one MLflow writer of a run.
_NOT_FOR_SERVERS = ("SWARM_TOKEN", sandbox.CLIENT_TOKEN_ENV, "MLFLOW_TRACKING_URI")


# A vLLM child or a verl worker group on Ray: 30-90 s on a GPU (CUDA graphs, compile), and past 120 s on
# a busy 2-core machine (a 60-minute soak's reference study lost two of its six vLLM runs to 120 s).
SLOW_START_S = 600.0


class LaunchError(RuntimeError):
    """A server did not come up (its log tail is in the message)."""


class RunProcesses:
    """The launcher's settings and what it knows about starting and reaching a run's processes."""

    def __init__(self, swarm_command: Sequence[str], *, model: str | None = None, threads: int = 1,
                 ready_timeout_s: float = 120.0, external_token: str | None = None,
                 mlflow_uri: str | None = None, gpus: Sequence[str] = (), artifacts_root: Path | None = None,
                 log_max_bytes: int = LOG_MAX_BYTES, log_keep: int = LOG_KEEP, box_read: Sequence[Path] = (),
                 keep_training_state: bool = False) -> None:
        self.log_max_bytes, self.log_keep = log_max_bytes, log_keep  # run logs' size cap (logs.cap)
        self.gpus = list(gpus)  # this machine's GPU ids runs may use (``resources.discover_gpus``)
        self.artifacts_root = artifacts_root  # where every study's run records are (who holds which GPU)
        self.swarm_command = list(swarm_command)
        self.mlflow_uri = mlflow_uri  # handed to our servers, so each run's metrics have one writer
        self.model = model  # None: the run's config.toml names the model (its `model` key), else swarm's default
        self.threads = threads
        self.ready_timeout_s = ready_timeout_s
        self.external_token = external_token
        self.box_read = list(box_read)  # files outside the study its boxed clients read (a data study's)
        self.keep_training_state = keep_training_state  # else an ended run sheds it (``shedding``)

    def shed_ended(self, record: RunRecord) -> None:
        """An ended run of ours keeps its checkpoints' weights only (``researcher.runs.shedding``); an
        external server's state is its owner's."""
        if not (self.keep_training_state or record.external) and record.state_dir:
            shedding.shed_training_state(Path(record.state_dir))

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_SERVERS}
        env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def _placed_env(self, record: RunRecord) -> dict[str, str]:
        env = self._server_env()
        if self.gpus and record.resources:
            # Its own devices only; "" hides every GPU from a run that asked for none.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(record.devices)
        return env

    def serve_argv(self, run_dir: Path, config: Path, record: RunRecord) -> list[str]:
        """The run's `swarm serve` command wherever it is placed (the placement adds where it listens):
        no step past the run's target (``--max-steps``: the steps in MLflow, run.json and the report
        are one number)."""
        state_dir = runs.private_dir(run_dir / STATE_DIR)
        # The user's `researcher start --model` beats the config's `model`; without it the config decides.
        model = ["--model", self.model] if self.model is not None else []
        argv = [*self.swarm_command, "serve", *model, "--state-dir", str(state_dir), "--config", str(config),
                "--seed", str(record.seed), "--threads", str(self.threads)]
        if record.target_step:
            argv += ["--max-steps", str(record.target_step)]
        return argv

    def client_argv(self, record: RunRecord) -> list[str]:
        """The run's `swarm run` command wherever it is placed."""
        return [*self.swarm_command, "run", record.client, *sandbox.box_flags(self.box_read), "--server", record.url,
                "--episodes", str(record.episodes),
                "--group-size", str(record.group_size), "--seed", str(record.seed),
                "--concurrency", str(record.concurrency), "--retry-for", "30",
                *(["--eval-every", str(record.eval_every)] if record.eval_every else []),
                *(["--eval-samples", str(record.eval_samples)] if record.eval_samples else [])]

    def _spawn_server(self, run_dir: Path, config: Path, record: RunRecord) -> tuple[int, float | None]:
        """Start the run's `swarm serve` on loopback. With a real MLflow run id the server is its run's one metrics
        writer (``--mlflow-run-id``; the URI goes by environment, it may hold credentials); a run whose
        MLflow id is still a spool placeholder (the store was down) has its metrics copied by the monitor."""
        argv = [*self.serve_argv(run_dir, config, record), "--host", "127.0.0.1", "--port", str(record.port)]
        env = self._placed_env(record)
        run_id = record.mlflow_run_id
        record.server_logs_mlflow = bool(self.mlflow_uri and run_id and not run_id.startswith(LOCAL_PREFIX))
        if record.server_logs_mlflow:
            env["MLFLOW_TRACKING_URI"] = str(self.mlflow_uri)
            argv += ["--mlflow-run-id", str(run_id)]
        return detached.spawn(argv, log_path=run_dir / SERVER_LOG, env=env, cwd=run_dir)

    def control_token(self, record: RunRecord) -> str | None:
        """The run's control token: the configured one for an external server, else the one our
        server keeps in its state dir (None until the server has written it)."""
        if record.external:
            return self.external_token
        return _read_token(Path(record.state_dir) / TOKEN_FILE) if record.state_dir else None

    def client_token(self, record: RunRecord) -> str | None:
        """What study code claims episodes with: our server's client token; an external server's
        configured token (the only one we know); the control token of a server that wrote no
        client token (an older swarm), with a warning."""
        if record.external:
            return self.external_token
        token = _read_token(Path(record.state_dir) / CLIENT_TOKEN_FILE) if record.state_dir else None
        if token is None:
            log.warning("the server of %s wrote no %s; its client gets the control token", record.key,
                        CLIENT_TOKEN_FILE)
            token = self.control_token(record)
        return token

    def client_for(self, record: RunRecord, timeout: float = 10.0) -> SwarmClient:
        # "" rather than None: never fall back to a SWARM_TOKEN meant for external servers.
        return SwarmClient(record.url, token=self.control_token(record) or "", timeout=timeout, retry_for_s=0)

    def ready_timeout_for(self, record: RunRecord) -> float:
        """How long ``record``'s server may take to answer its health check: longer where it starts
        vLLM (``engine = "vllm"``) or Ray (``trainer = "verl"``)."""
        slow = record.config.get("engine") == "vllm" or record.config.get("trainer") == "verl"
        return max(self.ready_timeout_s, SLOW_START_S) if slow else self.ready_timeout_s

    def wait_ready(self, run_dir: Path, record: RunRecord) -> None:
        deadline = time.monotonic() + self.ready_timeout_for(record)
        with self.client_for(record, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if client.health():
                    return
                if not record.external and not detached.alive(record.server_pid, record.server_started):
                    break
                time.sleep(0.3)
        raise LaunchError(f"server of {record.key} did not become ready:\n{tail(run_dir / SERVER_LOG)}")


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
