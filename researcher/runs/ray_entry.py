"""What a Ray job of a run executes on its cluster node (``python -m researcher.runs.ray_entry …``).

``serve RUN_DIR -- SWARM_SERVE_ARGV…``: picks the node's address and a free port there, writes
``RUN_DIR/address.json`` ({submission_id, host, port}) — the run's server reports its address back
through the run dir, which every node shares — then becomes ``swarm serve --host HOST --port PORT``.
The server makes (or reuses) its control and client tokens in its state dir, 0600, as it does
locally; nothing secret is on a command line or in the job's metadata.

``client RUN_DIR THREADS EPISODES -- SWARM_RUN_ARGV…``: reads the client token from the server's state
dir and becomes the boxed study client (``researcher.runs.sandbox``: clean environment with only that
token, resource limits), as the local launcher starts it.

The node address comes from ``RESEARCHER_BIND_HOST`` if set, else Ray's own idea of this node's IP
(``ray.util.get_node_ip_address``): on a one-machine test cluster that is 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from swarm import ports
from swarm.atomic import write_atomic

ADDRESS_FILE = "address.json"


def _log_to(path: Path) -> None:
    """Send this process's output (and the program it becomes) to ``path`` in the shared run dir, as a
    local run's: the monitor reads it while the run lives; Ray keeps the job's own log too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _node_host() -> str:
    host = os.environ.get("RESEARCHER_BIND_HOST")
    if host:
        return host
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def _ensure_token(host: str, argv: list[str]) -> None:
    """A server bound off loopback needs a control token it will not generate itself: made here, in
    its state dir (0600), where the server and the researcher read it; never on a command line."""
    import ipaddress
    import secrets

    if ipaddress.ip_address(host).is_loopback or "--state-dir" not in argv:
        return
    token = Path(argv[argv.index("--state-dir") + 1]) / "token"
    if token.is_file():
        return
    token.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(24))


def serve(run_dir: Path, argv: list[str]) -> None:
    host = _node_host()
    _ensure_token(host, argv)
    port = ports.free_port(host)
    submission = os.environ.get("RESEARCHER_SUBMISSION_ID", "")
    write_atomic(run_dir / ADDRESS_FILE, json.dumps({"submission_id": submission, "host": host, "port": port,
                                                     "node_id": os.environ.get("RAY_NODE_ID", "")}))
    print(f"ray job {submission}: swarm serve on {host}:{port}", flush=True)  # into the Ray job log
    _log_to(run_dir / "server.log")
    os.chdir(run_dir)
    os.execvp(argv[0], [*argv, "--host", host, "--port", str(port)])


def client(run_dir: Path, threads: int, episodes: int, state_dir: Path, argv: list[str]) -> None:
    from researcher.runs import sandbox

    token_file = state_dir / "client_token"
    if not token_file.is_file():
        token_file = state_dir / "token"
    token = token_file.read_text().strip()
    env = sandbox.study_env(run_dir, client_token=token, threads=threads)
    sandbox.Limits.for_episodes(episodes).apply()
    _log_to(run_dir / "client.log")
    os.chdir(run_dir)
    os.execvpe(argv[0], argv, env)


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    split = args.index("--")
    head, argv = args[:split], args[split + 1:]
    if head[0] == "serve":
        serve(Path(head[1]), argv)
    elif head[0] == "client":
        client(Path(head[1]), int(head[2]), int(head[3]), Path(head[4]), argv)
    else:
        raise SystemExit(f"unknown verb {head[0]!r}")


if __name__ == "__main__":
    main()
