"""Benchmark: many single-request clients against a real server vs one offline batched generate.

32 clients each send one chat request at the same moment (asyncio + httpx) to a real swarm server
running in its own process (``serve``); the same 32 prompts, ``max_tokens`` and seeds then go through
one offline ``backend.generate`` call of the same model in this process. Both sides run ``--repeats``
times, interleaved; the best time of each is compared. Per-row seeds make both produce the same
tokens, so the work is the same. The server batches continuously: requests that arrive while a
generation runs join it between decode steps and return when their own rows finish.

The same burst with one token per request is also timed: that is the HTTP cost alone (the httpx
client and the server's request handling, which share the GIL with decoding). Served time cannot
drop much below roughly offline + that floor, so the line prints the ceiling it implies.

Ends with ``RESULT batching_ratio=<offline_s / served_s>`` (aim: >= 0.7).

    .venv/bin/python tests/bench/bench_serving.py [--clients 32] [--max-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from swarm.backends import SamplingParams, load_backend
from swarm.models.tiny import build_tiny
from swarm.server import ServerConfig


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Client {i}: write something about the number {i * 7}."}]


def _start_server(model: Path, state: Path, window_ms: float, threads: int) -> tuple[subprocess.Popen[str], str, str]:
    settings = {"model": str(model), "port": 0, "state_dir": str(state),
                "config": {"batch_window_ms": window_ms, "max_batch_rows": 64}}
    code = ("import json, logging; from swarm.server import serve, ServerSettings; "
            "logging.basicConfig(format='%(relativeCreated)d %(message)s'); "
            "logging.getLogger('swarm.local.device_worker').setLevel(logging.DEBUG); "
            f"serve(ServerSettings.model_validate(json.loads({json.dumps(settings)!r})))")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    log = open(state.parent / "server.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=log, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (state / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.1)
    url = json.loads((state / "server.json").read_text())["url"]
    return proc, url, (state / "token").read_text().strip()


async def _served(url: str, token: str, clients: int, max_tokens: int) -> tuple[float, list[list[int]]]:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        await http.get("/healthz")

        async def one(i: int) -> list[int]:
            response = await http.post("/v1/chat/completions", json={
                "messages": _messages(i), "max_tokens": max_tokens, "temperature": 1.0, "seed": i})
            response.raise_for_status()
            return response.json()["choices"][0]["token_ids"]

        # Open one connection per client first (concurrent chat calls hold theirs), so the timed
        # burst measures serving rather than TCP set-up, as for agents with keep-alive clients.
        await asyncio.gather(*(http.post("/v1/chat/completions", json={
            "messages": _messages(i), "max_tokens": 1}) for i in range(clients)))
        started = time.perf_counter()
        outputs = await asyncio.gather(*(one(i) for i in range(clients)))
        return time.perf_counter() - started, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=float, default=ServerConfig().batch_window_ms)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--show-batches", action="store_true", help="print the server's batch log")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny(Path(tmp) / "tiny", seed=0)
        backend = load_backend(str(model), ServerConfig(), seed=0)
        prompts = [backend.render_prompt(_messages(i), None) for i in range(args.clients)]
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i) for i in range(args.clients)]
        backend.generate(prompts[:2], params[:2])  # warm-up
        proc, url, token = _start_server(model, Path(tmp) / "state", args.window_ms, args.threads)
        try:
            asyncio.run(_served(url, token, 4, args.max_tokens))  # warm-up
            offline_times, served_times, floor_times = [], [], []
            same = 0
            for _ in range(args.repeats):
                started = time.perf_counter()
                offline = backend.generate(prompts, params)
                offline_times.append(time.perf_counter() - started)
                served_s, served = asyncio.run(_served(url, token, args.clients, args.max_tokens))
                served_times.append(served_s)
                same = sum(g.token_ids == s for g, s in zip(offline, served))
                # The same burst asking for one token each: what HTTP alone costs (client + server).
                floor_times.append(asyncio.run(_served(url, token, args.clients, 1))[0])
            status = httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {token}"}).json()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if args.show_batches:
                print((Path(tmp) / "server.log").read_text())
    offline_s, served_s = min(offline_times), min(served_times)
    tokens = sum(len(g.token_ids) for g in offline)
    print(f"threads={args.threads} window_ms={args.window_ms} clients={args.clients} max_tokens={args.max_tokens} "
        f"generated_tokens={tokens} "
          f"identical_outputs={same}/{args.clients} server_rows_per_batch={status['throughput']['rows_per_batch']:.1f}")
    print(f"offline batched generate: {offline_s:.3f} s (runs: {', '.join(f'{t:.3f}' for t in offline_times)})")
    print(f"served, {args.clients} concurrent clients: {served_s:.3f} s (runs: {', '.join(f'{t:.3f}' for t in served_times)})")
    print(f"HTTP floor, {args.clients} clients x 1 token: {min(floor_times):.3f} s "
          f"(runs: {', '.join(f'{t:.3f}' for t in floor_times)}); ratio ceiling on this machine "
          f"~{offline_s / (offline_s + min(floor_times)):.2f}")
    print(f"RESULT batching_ratio={offline_s / served_s:.3f}")


if __name__ == "__main__":
    main()
