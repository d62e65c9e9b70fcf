"""Benchmark: 200 concurrent clients on loopback against a real server process, bounded time.

Each client loops claim → chat (openai SDK) → finish (``tests/e2e/reliability/rel_load.py``); the
server (``swarm serve`` subprocess, tiny model) trains while they run. Reports requests, failed
requests that were not the clients' fault (must be 0), latency percentiles, and the server's RSS
after warm-up versus at the end (memory must stay flat: trained episodes are evicted).

Ends with one line: ``RESULT failed=… requests=… episodes=… steps=… p50_ms=… p99_ms=…
rss_warm_mb=… rss_end_mb=… rss_growth_mb=…``.

    .venv/bin/python tests/bench/bench_load.py [--clients 200] [--seconds 120] [--warmup 40]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swarm" / "reliability"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared `support` package

from rel_harness import start_server
from rel_load import run_load
from support import free_port

CONFIG = {"group_size": 4, "min_group_size": 2, "batch_groups": 8, "max_tokens": 8, "max_staleness": 64,
          "lease_s": 300.0, "max_batch_rows": 128}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds before the baseline RSS sample")
    args = parser.parse_args()

    from swarm.models.tiny import build_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny(Path(tmp) / "model", seed=0)
        server = start_server(model, Path(tmp) / "state", port=free_port(), token="bench", config=CONFIG)
        samples: dict[str, float] = {}

        def on_tick(elapsed: float) -> None:
            rss = server.rss_mb()
            if "warm" not in samples and elapsed >= args.warmup:
                samples["warm"] = rss
            samples["end"] = rss
            samples["max"] = max(samples.get("max", 0.0), rss)

        try:
            result = asyncio.run(run_load(server.url, "bench", clients=args.clients, seconds=args.seconds,
                                          on_tick=on_tick))
            status = server.status()
            samples["end"] = server.rss_mb()
        finally:
            server.kill()
    for error, count in result.errors.most_common(10):
        print(f"  {count:5d}  {error}")
    print(f"clients={args.clients} seconds={args.seconds:g} episodes={result.episodes} "
          f"retried_429={result.retried_429} trained={status['episodes']['trained']} "
          f"rss_max_mb={samples.get('max', 0):.0f}")
    warm = samples.get("warm", samples["end"])
    print(f"RESULT failed={result.failed} requests={result.requests} episodes={result.episodes} "
          f"steps={status['step']} p50_ms={result.percentile(0.5) * 1000:.0f} "
          f"p99_ms={result.percentile(0.99) * 1000:.0f} rss_warm_mb={warm:.0f} rss_end_mb={samples['end']:.0f} "
          f"rss_growth_mb={samples['end'] - warm:.1f}")


if __name__ == "__main__":
    main()
