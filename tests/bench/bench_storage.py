"""Benchmark: how fast a training run's state dir grows, per retention setting, projected to 3 days.

For each ``retention`` setting a real ``swarm serve`` (tiny model, the letters study's config, with a
checkpoint every ``--checkpoint-every`` steps so retention has checkpoints to work from) and a real
``swarm run`` of ``studies/examples/letters/client.py`` train for ``--seconds``. The server logs to
``server.log`` with ``--log-file`` (rotated at ``--log-max-mb``, ``--log-keep`` old files); its stderr
and the client's output are captured beside it. Everything of the server under the state dir counts:
``buffer.db`` with its ``-wal``/``-shm``, checkpoints, its logs. The client's output (a line an
episode) is the client's, wherever its caller sends it, and is reported apart
(``client_output_3day_gb_at``). Growth is measured over the **second half** of
the run, once retention reached its steady state (the first checkpoints are written and SQLite reuses
the freed pages). What is capped by design is counted at its cap, not as growth: the checkpoints (the
newest 3, so 3 x the largest one), the WAL (auto-checkpointed at about 4 MB, counted at its size), the
buffer's event table (its newest 10,000 events), with ``since_checkpoint`` the traces, episode rows
and training log of the steps since the oldest kept checkpoint (``dbstat`` gives each table's bytes),
and the server's rotated log (at most ``(keep + 1) x max-mb``). Then, with ``N`` the episodes of 3
days at a rate ``R``:

    bytes_per_1k_episodes = 1000 x (growth of the uncapped tables and logs) / (episodes in the second half)
    projected_3day_gb     = (buffer at the end + uncapped growth per episode x N
                             + 3 x largest checkpoint + min(log cap, server log at the end + its growth x N)
                             + the captured stderr and client output grown likewise) / 1e9

``R`` is the measured rate (``projected_3day_gb``) and ``--project-rate`` (``projected_3day_gb_at``;
default 34/s, the letters example on an idle 2-core machine): a loaded machine trains slower and would
understate what a real run writes. The raw growth of the whole state dir is printed too
(``raw_bytes_per_1k_episodes``), and with ``since_checkpoint`` the pruned ledger's bytes per record.
``--ledger-rows N`` also measures the ledger at ``N`` records through the real store (small runs
prune too few for a per-record size beyond page granularity).

Prints per setting ``RESULT bytes_per_1k_episodes=<b> projected_3day_gb=<g> rate=<r>
projected_3day_gb_at=<g> project_rate=<r> client_output_3day_gb_at=<g> run=letters retention=<r>``
plus the parts. ``--model smollm2-135m`` runs the gsm-format
example with that model instead (``run=smollm2-gsm``; slow on a CPU).

    .venv/bin/python tests/bench/bench_storage.py [--seconds 120] [--retention all since_checkpoint]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
THREE_DAYS_S = 3 * 86400


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``, less a checkpoint being written (``.tmp-``/``.trash-``
    dirs exist for a second and would make a sample's size depend on its timing)."""
    return sum(p.stat().st_size for p in folder.rglob("*")
               if p.is_file() and not any(part.startswith((".tmp-", ".trash-")) for part in p.parts))


def _parts(state: Path) -> dict[str, int]:
    """Bytes by kind: the buffer (db, wal, shm), checkpoints (and the largest one), the server's rotated
    log, the other logs (captured stderr, client output), the rest."""
    buffer = sum(p.stat().st_size for p in state.glob("buffer.db*"))
    folder = state / "checkpoints"
    checkpoints = _bytes(folder) if folder.is_dir() else 0
    largest = max((_bytes(p) for p in folder.glob("step-*")), default=0) if folder.is_dir() else 0
    server_log = sum(p.stat().st_size for p in state.glob("server.log*"))
    client = (state / "client.log").stat().st_size if (state / "client.log").exists() else 0
    logs = sum(p.stat().st_size for p in state.glob("*.log*")) - server_log - client
    return {"buffer": buffer, "checkpoints": checkpoints, "largest_checkpoint": largest, "server_log": server_log,
            "logs": logs, "client_output": client,
            "other": _bytes(state) - buffer - checkpoints - server_log - logs - client}


def _status(url: str, token: str) -> dict:
    with httpx.Client(base_url=url, timeout=30.0, headers={"Authorization": f"Bearer {token}"}) as http:
        return dict(http.get("/api/v1/status").json())


def _tables(state: Path) -> dict[str, int]:
    """Bytes of each table and index of the buffer (SQLite's ``dbstat``), read-only."""
    with sqlite3.connect(f"{(state / 'buffer.db').as_uri()}?mode=ro", uri=True) as db:
        return {str(name): int(size) for name, size in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")}


def _buffer_pages(state: Path) -> tuple[int, int, int]:
    """(page size, pages, free pages) of the buffer, read-only beside the running server."""
    with sqlite3.connect(f"{(state / 'buffer.db').as_uri()}?mode=ro", uri=True) as db:
        return tuple(int(db.execute(f"PRAGMA {name}").fetchone()[0])  # type: ignore[return-value]
                     for name in ("page_size", "page_count", "freelist_count"))


def _run(setting: str, args: argparse.Namespace, work: Path) -> None:
    state = work / setting
    state.mkdir(parents=True)
    if args.model == "smollm2-135m":
        example, run_name = ROOT / "studies/examples/gsm-format", "smollm2-gsm"
        client = ["--data", str(example / "train.jsonl"), "--reward", f"{example / 'reward.py'}:score"]
    else:
        example, client, run_name = ROOT / "studies/examples/letters", [str(ROOT / "studies/examples/letters/client.py")], \
            "letters"
    config = state.parent / f"{setting}.toml"
    config.write_text((example / "config.toml").read_text()
                      + f"\ncheckpoint_every = {args.checkpoint_every}\nretention = \"{setting}\"\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    swarm = [sys.executable, "-m", "swarm.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    with open(state / "server-stderr.log", "ab") as server_out, open(state / "client.log", "ab") as client_log:
        server = subprocess.Popen([*swarm, "serve", "--model", args.model, "--config", str(config), "--port", str(port),
                                   "--state-dir", str(state), "--log-file", str(state / "server.log"),
                                   "--log-max-mb", str(args.log_max_mb), "--log-keep", str(args.log_keep)],
                                  stdout=server_out, stderr=subprocess.STDOUT, env=env)
        runner = None
        try:
            deadline = time.monotonic() + 300
            while not (state / "token").exists() or not _healthy(url):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {(state / 'server-stderr.log').read_text()[-2000:]}")
                time.sleep(0.5)
            token = (state / "token").read_text().strip()
            runner = subprocess.Popen([*swarm, "run", *client, "--server", url, "--state-dir", str(state)],
                                      stdout=client_log, stderr=subprocess.STDOUT, env=env)
            start = time.monotonic()
            time.sleep(args.seconds / 2)
            half_bytes, half, half_parts, half_tables = _bytes(state), _status(url, token), _parts(state), _tables(state)
            time.sleep(args.seconds / 2)
            end_bytes, end, end_parts, end_tables = _bytes(state), _status(url, token), _parts(state), _tables(state)
            elapsed = time.monotonic() - start
            page_size, pages, free = _buffer_pages(state)
            ledger = _ledger_rows(state)
        finally:
            for proc in (runner, server):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    episodes = end["episodes"]["finished"] - half["episodes"]["finished"]
    # What keeps growing: every table but the capped ones (the event log keeps its newest 10,000 rows;
    # with retention the traces, rows and log rows stop at about keep x checkpoint_every steps), and
    # the logs but the server's rotated one. The WAL (auto-checkpointed at about 4 MB), the checkpoints
    # (the newest 3) and the rotated log are capped too; a short run is still filling those caps.
    capped = {"events"} | ({"timelines", "sqlite_autoindex_timelines_1", "episodes", "sqlite_autoindex_episodes_1",
                            "training_log", "training_log_live"} if setting == "since_checkpoint" else set())
    table_growth = sum(end_tables.get(name, 0) - half_tables.get(name, 0) for name in end_tables if name not in capped)
    log_growth = end_parts["logs"] - half_parts["logs"]
    server_log_growth = end_parts["server_log"] - half_parts["server_log"]
    per_episode = (table_growth + log_growth) / episodes if episodes else float("nan")
    client_per_episode = (end_parts["client_output"] - half_parts["client_output"]) / max(episodes, 1)
    measured_rate = episodes / (args.seconds / 2)
    log_cap = (args.log_keep + 1) * args.log_max_mb * 2**20

    def projected(rate: float) -> float:
        later = rate * (THREE_DAYS_S - elapsed)  # episodes still to come in 3 days
        server_log = min(log_cap, end_parts["server_log"] + server_log_growth / max(episodes, 1) * later)
        return (end_parts["buffer"] + end_parts["logs"] + end_parts["other"] + per_episode * later
                + 3 * end_parts["largest_checkpoint"] + server_log) / 1e9

    def client_output(rate: float) -> float:  # the client's own output, captured here: not the server's state
        return (end_parts["client_output"] + client_per_episode * rate * (THREE_DAYS_S - elapsed)) / 1e9

    pruned_tables = {name: size for name, size in end_tables.items() if "pruned" in name}
    print(json.dumps({"retention": setting, "seconds": round(elapsed, 1), "steps": end["step"],
                      "episodes": end["episodes"], "episodes_second_half": episodes,
                      "bytes_half": half_parts, "bytes_end": end_parts, "buffer_db_mb": round(pages * page_size / 1e6, 2),
                      "buffer_free_pages": free, "tables_half": half_tables, "tables_end": end_tables,
                      "growth_per_episode": {name: round((end_tables.get(name, 0) - half_tables.get(name, 0))
                                                         / max(episodes, 1), 1) for name in end_tables}
                      | {"server stderr (uncapped)": round(log_growth / max(episodes, 1), 1),
                         "server.log (capped)": round(server_log_growth / max(episodes, 1), 1),
                         "client output (not server state)": round(client_per_episode, 1)},
                      "pruned_records": ledger,
                      "pruned_bytes_per_record": round(sum(pruned_tables.values()) / ledger, 1) if ledger else None,
                      "raw_bytes_per_1k_episodes": round(1000 * (end_bytes - half_bytes) / max(episodes, 1))}))
    print(f"RESULT bytes_per_1k_episodes={1000 * per_episode:.0f} projected_3day_gb={projected(measured_rate):.2f} "
          f"rate={measured_rate:.1f} projected_3day_gb_at={projected(args.project_rate):.2f} "
          f"project_rate={args.project_rate:g} client_output_3day_gb_at={client_output(args.project_rate):.2f} "
          f"run={run_name} retention={setting}", flush=True)


def _ledger_rows(state: Path) -> int:
    with sqlite3.connect(f"{(state / 'buffer.db').as_uri()}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM pruned").fetchone()[0])


def _ledger_bytes(rows: int, work: Path) -> None:
    """Bytes per pruned-ledger record at ``rows`` records: real episodes (server-made uuid ids) saved,
    trained over many steps and pruned through the real store, measured with ``dbstat``."""
    import uuid

    from swarm.server.durability.store import EpisodeStore
    from swarm.server.records.finished import FinishedEpisode, Outcome
    from swarm.server.records.timeline import EpisodeTrace, Timeline

    timeline = Timeline(tokens=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], versions=[0], calls=1)
    per_step = 32
    with EpisodeStore(work / "buffer.db") as store:
        for step in range(1, rows // per_step + 1):
            ids = [uuid.uuid4().hex for _ in range(per_step)]
            for episode_id in ids:
                store.save_finished(FinishedEpisode(episode_id=episode_id, task_id="t", group_id="g", group_size=1,
                                                    category=None, client_id="c", outcome=Outcome(reward=1.0),
                                                    trace=EpisodeTrace(timelines=[timeline])))
            store.commit_step(step, ids)
            if step % 5 == 0:  # a checkpoint every 5 steps
                store.prune(step)
        store.prune(rows // per_step)
    size = _tables(work)
    pruned = sum(v for k, v in size.items() if "pruned" in k)
    print(json.dumps({"ledger_records": rows // per_step * per_step, "ledger_bytes": pruned}))
    print(f"RESULT pruned_bytes_per_record={pruned / (rows // per_step * per_step):.1f} records={rows}", flush=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="training time per retention setting")
    parser.add_argument("--retention", nargs="*", default=["all", "since_checkpoint"],
                        choices=["all", "since_checkpoint"])
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--log-max-mb", type=float, default=64.0, help="the server's --log-max-mb")
    parser.add_argument("--log-keep", type=int, default=2, help="the server's --log-keep")
    parser.add_argument("--project-rate", type=float, default=34.0,
                        help="episodes/s for projected_3day_gb_at (the letters example on an idle 2-core machine)")
    parser.add_argument("--ledger-rows", type=int, default=0, help="also measure the pruned ledger at this many records")
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2-135m"],
                        help="smollm2-135m: the gsm-format example with SmolLM2 (slow on a CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        if args.ledger_rows:
            (Path(tmp) / "ledger").mkdir()
            _ledger_bytes(args.ledger_rows, Path(tmp) / "ledger")
        for setting in args.retention:
            _run(setting, args, Path(tmp))


if __name__ == "__main__":
    main()
