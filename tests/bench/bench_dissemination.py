"""Benchmark: a new policy version to K workers by the pipelined relay chain, by a star, and by lattica (issue 24).

K worker nodes (``Depot`` + ``Inbox`` + ``relay_router`` under uvicorn, one process each) on
loopback; a model of S bytes (random float32 tensors) encoded into 1 MB chunks; every sender's upload
shaped to B by its own token bucket. Measured, median of ``--repeats``:

- chain: ``disseminate`` along all K (each worker forwards each chunk while receiving the next);
- star: the server pushes to each of the K directly, its one bucket shared by the K pushes.

``chain_over_limit`` = chain time / (S/B) (target <= 1.25); ``star_over_chain`` = star / chain
(target >= 2.5 at K = 4). ``delta_bytes_ratio`` = full bytes / delta bytes summed over 10 training
steps of the tiny model on the letters study (its own tasks, reward, config and learning rate),
driving the torch backend directly, one full snapshot and one delta over the previous step per step.
Extra lines (not in RESULT): the same ratio for bf16 copies and at a lower learning rate, and
``lattica`` (Gradient's libp2p SDK): K peers ``get_block`` one block of S bytes from one provider,
unshaped, against the HTTP chain unshaped.

Ends with ``RESULT chain_over_limit=... star_over_chain=... delta_bytes_ratio=...``.

    .venv/bin/python tests/bench/bench_dissemination.py [--workers 4] [--megabytes 48] [--rate-mb 10]
        [--parts relay,lattica,delta]

B defaults to 10 MB/s (80 Mbit/s, a home uplink): on 2 shared cores five Python processes cannot
relay 4 x 50 MB/s, and the ratio to S/B only measures the relay rule while shaping, not CPU, sets the pace.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared `support` package
# The repository before tests/, so that `swarm` is always the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support import ROOT, free_port, wait_for

TOKEN_ENV = "BENCH_POOL_TOKEN"
MB = 1 << 20
LETTERS = ROOT / "studies" / "examples" / "letters"


# -- the worker nodes ---------------------------------------------------------------------------------


def _serve_node(port: int, rate: float | None) -> None:
    import uvicorn
    from fastapi import FastAPI, HTTPException, Request

    from swarm.weights.relay import Depot, Inbox, relay_router

    token = os.environ[TOKEN_ENV]

    def authorize(request: Request) -> None:
        if request.headers.get("authorization") != f"Bearer {token}":
            raise HTTPException(401, "wrong worker token")

    async def on_version(manifest, chunks) -> None:  # a worker would decode and load here
        return None

    depot = Depot(keep=2)
    app = FastAPI()
    app.include_router(relay_router(depot, Inbox(depot, on_version=on_version, token=token, rate_bytes_per_s=rate),
                                    authorize))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


def _start_nodes(count: int, rate: float | None, token: str, logs: Path) -> list[tuple[str, subprocess.Popen]]:
    import httpx

    nodes = []
    for i in range(count):
        port = free_port()
        args = [sys.executable, __file__, "--serve-node", str(port)] + (["--node-rate", str(rate)] if rate else [])
        with open(logs / f"node{i}.log", "ab") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, TOKEN_ENV: token})
        nodes.append((f"http://127.0.0.1:{port}", process))

    def answers(url: str) -> bool:
        try:
            return httpx.get(f"{url}/pool/v1/versions", headers={"Authorization": f"Bearer {token}"}).is_success
        except httpx.TransportError:
            return False

    for i, (url, process) in enumerate(nodes):
        wait_for(lambda: answers(url), 60, what=f"worker node {url}", proc=process, log=logs / f"node{i}.log")
    return nodes


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# -- chain and star -----------------------------------------------------------------------------------


def _model(megabytes: float, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    per = int(megabytes * MB) // 4 // 12
    return {f"model.layers.{i}.weight": torch.randn(per, generator=gen) for i in range(12)}


async def _chain(depot, version: int, workers: list[str], token: str, rate: float | None):
    from swarm.weights.relay import disseminate

    return await disseminate(depot, version, workers, token=token, rate_bytes_per_s=rate, timeout_s=600)


async def _star(depot, version: int, workers: list[str], token: str, rate: float | None):
    """The server pushes to each worker itself, all K pushes drawing on its one bucket."""
    from swarm.weights.bucket import TokenBucket
    from swarm.weights.relay import disseminate

    bucket = TokenBucket(rate)
    began = time.monotonic()
    reports = await asyncio.gather(*(disseminate(depot, version, [w], token=token, bucket=bucket, timeout_s=600)
                                     for w in workers))
    return time.monotonic() - began, reports


def _relay_runs(args, token: str, logs: Path) -> tuple[float, float, float, int]:
    """(chain s, star s, unshaped chain s, payload bytes)."""
    from swarm.weights.relay import Depot
    from swarm.weights.shards import encode

    rate = args.rate_mb * MB
    depot = Depot(keep=64)
    versions = iter(range(1, 1000))
    weights = _model(args.megabytes, seed=0)

    def fresh() -> int:
        version = next(versions)
        manifest, chunks = encode(version, weights, chunk_bytes=args.chunk_kb * 1024)
        depot.put(manifest, chunks)
        return version

    nodes = _start_nodes(args.workers, rate, token, logs)
    workers = [url for url, _ in nodes]
    try:
        first = fresh()
        size = depot.get(first)[0].total_bytes  # type: ignore[index]
        asyncio.run(_chain(depot, first, workers, token, rate))  # warm-up: connections, code paths
        limit = size / rate
        print(f"K={args.workers} S={size / MB:.1f} MB B={args.rate_mb:g} MB/s  S/B={limit:.2f} s", flush=True)
        chain_s, star_s = [], []
        for _ in range(args.repeats):  # alternate so machine noise hits both alike
            report = asyncio.run(_chain(depot, fresh(), workers, token, rate))
            assert not report.failed, report
            chain_s.append(report.seconds)
            seconds, reports = asyncio.run(_star(depot, fresh(), workers, token, rate))
            assert not any(r.failed for r in reports), reports
            star_s.append(seconds)
            print(f"  chain {report.seconds:6.2f} s ({report.seconds / limit:.2f} x S/B, server sent "
                  f"{report.bytes_sent / size:.2f} copies)   star {seconds:6.2f} s "
                  f"(server sent {sum(r.bytes_sent for r in reports) / size:.2f} copies)", flush=True)
    finally:
        _stop([process for _, process in nodes])
    nodes = _start_nodes(args.workers, None, token, logs)
    workers = [url for url, _ in nodes]
    try:
        asyncio.run(_chain(depot, fresh(), workers, token, None))
        unshaped = statistics.median(asyncio.run(_chain(depot, fresh(), workers, token, None)).seconds
                                     for _ in range(args.repeats))
    finally:
        _stop([process for _, process in nodes])
    return statistics.median(chain_s), statistics.median(star_s), unshaped, size


# -- lattica --------------------------------------------------------------------------------------------


def _lattica_role(role: str, port: int, size: int, boot: str, cid: str) -> None:
    """A provider (puts one random block of ``size`` bytes, prints its peer id and cid) or a peer
    (bootstraps to the provider, waits for a line on stdin, gets the block, prints the seconds)."""
    from lattica import Lattica

    builder = Lattica.builder().with_listen_addrs([f"/ip4/127.0.0.1/tcp/{port}"]).with_mdns(False).with_upnp(False)
    if role == "provider":
        node = builder.build()
        cid = node.put_block(os.urandom(size))
        print(node.peer_id(), cid, flush=True)
        sys.stdin.readline()
        return
    node = builder.with_bootstraps([boot]).build()
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    _, data = node.get_block(cid, timeout_secs=600)
    print(len(data), time.monotonic() - began, flush=True)


def _lattica_run(workers: int, size: int) -> float | None:
    """Seconds until all ``workers`` peers hold the provider's block (None: lattica not installed)."""
    if importlib.util.find_spec("lattica") is None:
        return None

    def start(*role: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, __file__, "--lattica", *role], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)

    port = free_port()
    provider = start("provider", str(port), str(size), "-", "-")
    peers: list[subprocess.Popen] = []
    try:
        peer_id, cid = provider.stdout.readline().split()  # type: ignore[union-attr]
        boot = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}"
        peers = [start("peer", str(free_port()), str(size), boot, cid) for _ in range(workers)]
        for peer in peers:
            assert peer.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        time.sleep(1.0)  # let the peers finish dialling the provider
        began = time.monotonic()
        for peer in peers:
            peer.stdin.write("go\n")  # type: ignore[union-attr]
            peer.stdin.flush()  # type: ignore[union-attr]
        for peer in peers:
            got, _ = peer.stdout.readline().split()  # type: ignore[union-attr]
            assert int(got) == size, got
        return time.monotonic() - began
    finally:
        for process in [provider, *peers]:
            process.kill()
            process.wait()


# -- deltas over letters training -----------------------------------------------------------------------


def _letters_deltas(steps: int, lr: float | None, chunk_bytes: int) -> dict[str, tuple[int, int]]:
    """Train the tiny model on letters for ``steps`` steps; per step encode the exported weights as a
    full snapshot and as a delta over the previous step. {"float32"|"bfloat16": (full bytes, delta bytes)}."""
    import torch

    from swarm.backends import SamplingParams, load_backend
    from swarm.models.tiny import build_tiny
    from swarm.server import ServerConfig
    from swarm.server.records.timeline import EpisodeTrace
    from swarm.weights.shards import decode, encode

    spec = importlib.util.spec_from_file_location("letters_client", LETTERS / "client.py")
    letters = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(letters)  # type: ignore[union-attr]
    settings = tomllib.loads((LETTERS / "config.toml").read_text())
    config = ServerConfig(**({**settings, "lr": lr} if lr is not None else settings))
    tasks = letters.tasks(seed=0)
    totals = {"float32": [0, 0], "bfloat16": [0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        backend = load_backend(str(build_tiny(Path(tmp) / "tiny", seed=0)), config, seed=0)
        previous = {name: t.detach().clone() for name, t in backend.export_weights().items()}
        for step in range(1, steps + 1):
            prompts, groups = [], []
            for _g in range(config.batch_groups):
                task = next(tasks)
                prompt = backend.render_prompt([{"role": "user", "content": task["prompt"]}], None)
                prompts += [prompt] * config.group_size
                groups += [task["task_id"]] * config.group_size
            params = [SamplingParams(max_tokens=letters.COMPLETION_TOKENS, temperature=config.temperature)
                      for _ in prompts]
            generations = backend.generate(prompts, params)
            rewards = [letters.reward(backend.decode(gen.token_ids)) for gen in generations]
            samples = []
            for prompt, gen, advantage in zip(prompts, generations, backend.advantages(rewards, groups, config)):
                trace = EpisodeTrace(merge=True)
                trace.record(prompt, [(gen.token_ids, gen.logprobs)], backend.policy_version, 1.0)
                samples += trace.samples(advantage)
            backend.train_step(samples, config)
            current = {name: t.detach().clone() for name, t in backend.export_weights().items()}
            for dtype, total in totals.items():
                cast = {n: t.to(getattr(torch, dtype)) for n, t in current.items()}
                base = {n: t.to(getattr(torch, dtype)) for n, t in previous.items()}
                full, _ = encode(step, cast, chunk_bytes=chunk_bytes)
                delta, chunks = encode(step, cast, base=(step - 1, base), chunk_bytes=chunk_bytes)
                rebuilt = decode(delta, chunks, base=(step - 1, base))
                assert all(torch.equal(rebuilt[n].view(-1).view(torch.uint8), cast[n].view(-1).view(torch.uint8))
                           for n in cast), "a delta did not round-trip"
                total[0] += full.total_bytes
                total[1] += delta.total_bytes
            print(f"  step {step:2d}: reward {sum(rewards) / len(rewards):.3f}", flush=True)
            previous = current
    return {dtype: (full, delta) for dtype, (full, delta) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--megabytes", type=float, default=48.0, help="model size S")
    parser.add_argument("--rate-mb", type=float, default=10.0, help="upload bandwidth B per sender, MB/s")
    parser.add_argument("--chunk-kb", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="letters training steps for the delta ratio")
    parser.add_argument("--low-lrs", type=float, nargs="*", default=[1e-5, 1e-6],
                        help="learning rates of the extra delta lines")
    parser.add_argument("--parts", default="relay,lattica,delta", help="which measurements to run (comma-separated)")
    parser.add_argument("--serve-node", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--node-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--lattica", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_node:
        return _serve_node(args.serve_node, args.node_rate)
    if args.lattica:
        role, port, size, boot, cid = args.lattica
        return _lattica_role(role, int(port), int(size), boot, cid)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    token = secrets.token_hex(16)
    parts = set(args.parts.split(","))
    results = []
    if "relay" in parts:
        with tempfile.TemporaryDirectory() as logs:
            chain_s, star_s, unshaped_s, size = _relay_runs(args, token, Path(logs))
        limit = size / (args.rate_mb * MB)
        results += [f"chain_over_limit={chain_s / limit:.3f}", f"star_over_chain={star_s / chain_s:.2f}"]
        if "lattica" in parts:
            lattica_s = _lattica_run(args.workers, size)
            if lattica_s is None:
                print("lattica: not installed (pip install lattica): no comparison")
            else:
                print(f"unshaped, K={args.workers}, S={size / MB:.1f} MB: http_chain={unshaped_s:.2f} s "
                      f"({size / MB / unshaped_s:.0f} MB/s per hop)  lattica_get_block={lattica_s:.2f} s "
                      f"(lattica/http_chain={lattica_s / unshaped_s:.2f})", flush=True)
    if "delta" in parts:
        print(f"delta over {args.steps} letters steps (tiny model, {args.chunk_kb} KB chunks):", flush=True)
        ratios = {}
        for label, lr in [("default lr", None)] + [(f"lr={lr:g}", lr) for lr in args.low_lrs]:
            for dtype, (full, delta) in _letters_deltas(args.steps, lr, args.chunk_kb * 1024).items():
                ratios[(label, dtype)] = full / delta
                print(f"  {label:>10} {dtype:>8}: full {full / MB:7.2f} MB  delta {delta / MB:7.2f} MB  "
                      f"full/delta={full / delta:.2f}", flush=True)
        results.append(f"delta_bytes_ratio={ratios[('default lr', 'float32')]:.2f}")
    print("RESULT " + " ".join(results))

if __name__ == "__main__":
    main()
