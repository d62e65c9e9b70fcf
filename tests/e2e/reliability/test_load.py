"""Load on loopback (small in-suite version of ``tests/bench/bench_load.py``): 40 concurrent clients
run claim → chat → finish loops against a real server process for 10 s with no failed request, and
the server keeps training while they do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rel_harness import start_server
from rel_load import run_load
from support import free_port

CONFIG = {"group_size": 4, "min_group_size": 2, "batch_groups": 4, "max_tokens": 8, "max_staleness": 64,
          "lease_s": 120.0}


@pytest.mark.slow
def test_rel_load_40_clients_no_failures(rel_model: Path, tmp_path: Path, servers: list) -> None:
    server = start_server(rel_model, tmp_path / "state", port=free_port(), token="load", config=CONFIG)
    servers.append(server)
    result = asyncio.run(run_load(server.url, "load", clients=40, seconds=10.0))
    status = server.status()
    assert result.failed == 0, result.errors.most_common(5)
    assert result.episodes > 40
    assert status["step"] >= 1 and status["episodes"]["finished"] == result.episodes
    print(f"\nLOAD40 requests={result.requests} episodes={result.episodes} failed={result.failed} "
          f"p50_ms={result.percentile(0.5) * 1000:.0f} p99_ms={result.percentile(0.99) * 1000:.0f} "
          f"steps={status['step']}")
