"""Benchmark: rollout throughput of a generator pool with 1, 2 and 4 workers of equal speed.

For each pool size a ``swarm serve --no-local-generator`` process (tiny model; ``batch_groups`` so
large that it never trains, so only rollouts are measured) gets that many ``swarm worker --engine
torch`` processes, each capped by ``--max-tokens-per-s`` to the same rate (emulating equal machines
slower than this one's cores, so the pool and not the CPU is what is measured), and ``swarm run``
drives the letters study against it (32 episodes in flight, one 16-token chat call each). After a
warm-up the tokens the workers generate (their own count) are measured over a fixed window.

Ends with ``RESULT pool_scaling_4=<tokens/s with 4 workers / with 1> pool_scaling_2=<2 / 1>``
(aim: pool_scaling_4 >= 3).

    .venv/bin/python tests/bench/bench_pool.py [--rate 40] [--seconds 40] [--warmup 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared `support` package

from support import ROOT, ServeProcess, WorkerProcess, free_port, study_run

LETTERS = ROOT / "studies" / "examples" / "letters"
CONFIG = "group_size = 8\nbatch_groups = 4096\nmin_group_size = 2\nmax_tokens = 16\nmode = \"async\"\n"


def measure(workers: int, rate: float, seconds: float, warmup: float, tmp: Path) -> float:
    """Tokens per second the pool generates with ``workers`` workers capped at ``rate`` tokens/s each
    (tokens, not finished episodes: the run's held-out round also takes the pool's time, longest with
    one worker, and its episodes are not counted as finished)."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "config.toml"
    config.write_text(CONFIG)
    server = ServeProcess(port=free_port(), state_dir=tmp / f"pool-{workers}", config=config,
                          extra_args=("--no-local-generator",)).start()
    pool = [WorkerProcess(server, f"w{i}", ("--max-tokens-per-s", str(rate), "--capacity", "64"))
            for i in range(workers)]
    try:
        for worker in pool:
            worker.start()
        for worker in pool:
            worker.wait_ready()
        with study_run(LETTERS / "client.py", server, tmp / f"run-{workers}.log"):
            time.sleep(warmup)
            before, tokens_before, started = server.status()["episodes"]["finished"], _tokens(pool), time.monotonic()
            time.sleep(seconds)
            after, tokens_after = server.status()["episodes"]["finished"], _tokens(pool)
            elapsed = time.monotonic() - started
    finally:
        for worker in pool:
            worker.stop()
        server.stop()
    rate_eps, tokens_per_s = (after - before) / elapsed, (tokens_after - tokens_before) / elapsed
    print(f"{workers} worker(s) at {rate:g} tokens/s each: {after - before} episodes in {elapsed:.1f} s "
          f"= {rate_eps:.2f} episodes/s, {tokens_per_s:.1f} tokens/s ({tokens_per_s / (workers * rate):.0%} of the "
          "pool's cap)", flush=True)
    return tokens_per_s


def _tokens(pool: list[WorkerProcess]) -> int:
    """Tokens the workers generated so far (their own count, ``GET /pool/v1/health``)."""
    return sum(int(httpx.get(f"{w.url}/pool/v1/health", timeout=10).json()["produced_tokens"]) for w in pool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=40.0, help="tokens/s each worker may generate")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured window per pool size")
    parser.add_argument("--warmup", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {n: measure(n, args.rate, args.seconds, args.warmup, Path(tmp) / f"n{n}") for n in (1, 2, 4)}
    print(f"RESULT pool_scaling_4={results[4] / results[1]:.2f} pool_scaling_2={results[2] / results[1]:.2f}")


if __name__ == "__main__":
    main()
