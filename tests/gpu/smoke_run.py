"""GPU smoke run, driven by ``tests/gpu/smoke.sh``: ``swarm serve --engine vllm --trainer verl`` trains letters.

For each model (the tiny preset, then ``--model-dir`` if given) a real ``swarm serve`` starts with the
letters config in sync mode (every sample on-policy, so the log-prob gap measures the trainer/vLLM
mismatch, not staleness) plus ``--serve-flag`` flags, the letters client runs until ``--steps``
training steps are committed, and one line is printed, in a fixed format to compare runs over time:

    RESULT gpu_steps_per_s=<s> weight_sync_s=<s> logprob_diff_max=<x> model=<name> weight_transfer=<kind> steps=<n>
           logprob_diff_mean=<x>   (one line)

``gpu_steps_per_s``: (n - 1) / (time of step n - time of step 1), so start-up and the first step
(CUDA graph capture, NCCL warm-up) are left out; ``weight_sync_s``: mean ``perf/weight_sync_s`` of
steps 2..n; ``logprob_diff_max``: the largest ``rollout/logprob_diff_max`` of any step (and the mean of
``rollout/logprob_diff_mean``). Without CUDA it
refuses to run unless ``--allow-cpu`` (a dry run of this script on the CPU builds, as done where it
was written). Every process started here is stopped on the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
from bench_vllm import ENV, LETTERS, SWARM, Server, _kill_group, _stop_server, _tail  # noqa: E402


def _config(work: Path) -> Path:
    path = work / "letters-sync.toml"
    lines = [line for line in (LETTERS / "config.toml").read_text().splitlines() if not line.startswith("mode")]
    path.write_text("\n".join([*lines, 'mode = "sync"', ""]))
    return path


def _start(work: Path, name: str, model: str, flags: list[str], timeout: float) -> Server:
    state, log = work / name, work / f"{name}.log"
    command = [str(SWARM), "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", "--state-dir",
               str(state), "--config", str(_config(work)), "--engine", "vllm", "--trainer", "verl", *flags]
    started = time.perf_counter()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, start_new_session=True)
    while not (state / "server.json").exists():
        if proc.poll() is not None or time.perf_counter() - started > timeout:
            _stop_server(proc, None)
            raise RuntimeError(f"swarm serve did not start; its log ends:\n{_tail(log)}")
        time.sleep(0.5)
    url = json.loads((state / "server.json").read_text())["url"]
    server = Server(proc, url, (state / "token").read_text().strip(), state, log, time.perf_counter() - started)
    server.remember_tree()
    return server


def _train(server: Server, work: Path, name: str, steps: int, timeout: float) -> list[dict]:
    """Run the letters client until ``steps`` steps are committed; their metrics rows."""
    with open(work / f"{name}-client.log", "wb") as sink:
        client = subprocess.Popen([str(SWARM), "run", str(LETTERS / "client.py"), "--server", server.url,
                                   "--state-dir", str(server.state), "--eval-every", "0"],
                                  cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **ENV},
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while len(rows := server.metrics()) < steps:
            if client.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{len(rows)} of {steps} steps; server log ends:\n{_tail(server.log)}")
            time.sleep(1.0)
        return sorted(rows, key=lambda r: r["step"])[:steps]
    finally:
        _kill_group(client.pid)
        client.wait()


def result_line(rows: list[dict], model: str, transfer: str) -> str:
    """The fixed ``RESULT`` line for the committed steps ``rows`` (see the module docstring)."""
    span = rows[-1]["time"] - rows[0]["time"]
    rate = (len(rows) - 1) / span if span > 0 else float("nan")
    syncs = [r["metrics"].get("perf/weight_sync_s", float("nan")) for r in rows[1:]]
    diff = max(r["metrics"].get("rollout/logprob_diff_max", float("nan")) for r in rows)
    mean = sum(r["metrics"].get("rollout/logprob_diff_mean", float("nan")) for r in rows) / len(rows)
    return (f"RESULT gpu_steps_per_s={rate:.4f} weight_sync_s={sum(syncs) / len(syncs):.4f} "
            f"logprob_diff_max={diff:.6f} model={model} weight_transfer={transfer} steps={len(rows)} "
            f"logprob_diff_mean={mean:.6f}")


def run(model: str, work: Path, args: argparse.Namespace) -> str:
    name = Path(model).name
    server = _start(work, name, model, args.serve_flag, args.start_timeout)
    try:
        transfer = server.status()["generator"].get("weight_transfer", "?")
        print(f"{name}: server up in {server.ready_s:.1f} s, weight transfer {transfer}", flush=True)
        rows = _train(server, work, name, args.steps, args.train_timeout)
    finally:
        server.remember_tree()
        _stop_server(server.proc, server)
    return result_line(rows, name, transfer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", help="a local Hugging Face model folder, run after the tiny preset")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--serve-flag", action="append", default=[], help="extra `swarm serve` flag (repeatable)")
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--train-timeout", type=float, default=1800.0)
    parser.add_argument("--allow-cpu", action="store_true", help="dry-run this script without CUDA")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("SKIP: no CUDA device visible (tests/gpu/smoke.sh needs a GPU)")
        return 0
    models = ["tiny", *([str(Path(args.model_dir).resolve())] if args.model_dir else [])]
    with tempfile.TemporaryDirectory(prefix="swarm-gpu-smoke-") as tmp:
        lines = [run(model, Path(tmp), args) for model in models]
    for line in lines:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except httpx.HTTPError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        sys.exit(1)
