"""Benchmark: SmolLM2-135M-Instruct (``smollm2-135m``) generation and one GRPO iteration on this machine.

The same 32 chat prompts (arith word problems with the format instruction, ChatML-rendered), 64 new
tokens each (``ignore_eos``: every row makes exactly 64), temperature 1.0, through:

(a) a ``swarm serve --model smollm2-135m`` process, 32 concurrent chat calls on the control token;
(b) Hugging Face ``generate`` batched in this process (left-padded, ``min_new_tokens = 64``);
(c) vLLM's own offline ``LLM.generate`` in ``.venv-vllm`` (skipped, and said so, if it is absent);

then one GRPO iteration (generate, score, update) of 4 prompts x 8 samples x 64 tokens with our torch
backend against TRL's ``GRPOTrainer`` on the same folder (``bench_vs_trl``'s two loops). Every side
uses the same torch thread count (``--threads``). Tokens/s are wall-clock; the load average before
each part is printed, because this machine is shared. Ends with

    RESULT swarm_over_hf_generate=<x> swarm_over_vllm=<x> trl_over_swarm=<x>

Run: ``.venv/bin/python tests/bench/bench_real_model.py [--threads 2] [--repeats 2] [--no-trl]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx
import torch

from swarm.models.resolve import resolve_model_folder
from swarm.text.templates import load_tokenizer, render_chat

ROOT = Path(__file__).resolve().parents[2]
ROWS, NEW_TOKENS = 32, 64
VLLM_SCRIPT = """
import json, os, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
folder, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = LLM(model=folder, dtype="float32", max_model_len=1024, enforce_eager=False, seed=0)
params = SamplingParams(max_tokens=new, temperature=1.0, ignore_eos=True)
runs = []
for _ in range(int(sys.argv[4]) + 1):  # the first run warms up
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    runs.append(sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start))
print("VLLM_TOKENS_PER_S", json.dumps(runs[1:]))
"""


def questions() -> list[str]:
    """The gsm-format example's first held-out questions (its make_data, loaded from its file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gsm_make_data", ROOT / "studies/examples/gsm-format/make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, test = module.make(0, ROWS)
    return [row["prompt"][0]["content"] for row in test]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def bench_server(folder_name: str, messages: list[list[dict]], threads: int, repeats: int, work: Path) -> list[float]:
    """(a): tokens/s of 32 concurrent chat calls against a fresh server, per repeat (after one warm-up)."""
    from support import ServeProcess, free_port  # tests/ is on sys.path (see main)

    server = ServeProcess(port=free_port(), state_dir=work / "serve", model=folder_name,
                          extra_args=("--threads", str(threads)))
    server.start(600)
    try:
        async def burst() -> float:
            async with httpx.AsyncClient(base_url=server.url, timeout=900,
                                         headers={"Authorization": f"Bearer {server.token}"}) as http:
                async def one(m: list[dict]) -> int:
                    r = await http.post("/v1/chat/completions", json={
                        "messages": m, "max_tokens": NEW_TOKENS, "temperature": 1.0, "ignore_eos": True})
                    r.raise_for_status()
                    return r.json()["usage"]["completion_tokens"]
                start = time.perf_counter()
                tokens = await asyncio.gather(*(one(m) for m in messages))
                return sum(tokens) / (time.perf_counter() - start)

        runs = [asyncio.run(burst()) for _ in range(repeats + 1)][1:]
    finally:
        server.stop()
    return runs


def bench_hf(folder: Path, prompts: list[list[int]], repeats: int) -> list[float]:
    """(b): tokens/s of one batched ``generate`` call, per repeat (after one warm-up)."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    runs = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id)
        runs.append((out.shape[1] - batch["input_ids"].shape[1]) * len(prompts) / (time.perf_counter() - start))
    return runs[1:]


def bench_vllm(folder: Path, prompts: list[list[int]], threads: int, repeats: int) -> list[float] | None:
    """(c): tokens/s of vLLM's offline generate in .venv-vllm, per repeat (after one warm-up); None without it."""
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        print("vllm: .venv-vllm is absent (bash .ci/setup-vllm builds it): skipped")
        return None
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": str(threads),
           "VLLM_CPU_OMP_THREADS_BIND": "nobind" if threads < os.cpu_count() else "auto"}
    done = subprocess.run([str(python), "-c", VLLM_SCRIPT, str(folder), json.dumps(prompts), str(NEW_TOKENS),
                           str(repeats)], capture_output=True, text=True, env=env, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("VLLM_TOKENS_PER_S"):
            return json.loads(line.split(" ", 1)[1])
    print(f"vllm: failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return None


def bench_grpo(folder: Path, threads: int) -> float:
    """One GRPO iteration, ours against TRL's, with ``bench_vs_trl``'s loops: TRL s / our s."""
    import bench_vs_trl

    args = argparse.Namespace(iterations=2, warmup=1, prompts=4, group=8, max_new=NEW_TOKENS, lr=1e-5, threads=threads)
    prompts = bench_vs_trl.make_prompts((args.warmup + args.iterations) * args.prompts, seed=1)
    ours, _, _ = bench_vs_trl.run_swarm(folder, prompts, args)
    with tempfile.TemporaryDirectory() as tmp:
        theirs, _, _ = bench_vs_trl.run_trl(folder, prompts, args, Path(tmp))
    print(f"grpo iteration: swarm {statistics.fmean(ours):.2f} s, trl {statistics.fmean(theirs):.2f} s")
    return statistics.fmean(theirs) / statistics.fmean(ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads for every side")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per generation side (after a warm-up)")
    parser.add_argument("--no-trl", action="store_true", help="skip the GRPO iteration against TRL")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # The process harness (support); swarm is imported first, so that it is the package.
    sys.path.append(str(ROOT / "tests"))

    folder = resolve_model_folder("smollm2-135m")
    tokenizer = load_tokenizer(folder)
    messages = [[{"role": "user", "content": q}] for q in questions()]
    prompts = [render_chat(tokenizer, m, None) for m in messages]
    print(f"{ROWS} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens) x {NEW_TOKENS} new tokens, "
          f"threads {args.threads}, {args.repeats} timed runs per side")
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        print(f"load {load()}: swarm server ...", flush=True)
        swarm = bench_server("smollm2-135m", messages, args.threads, args.repeats, Path(tmp))
    print(f"swarm server: {' '.join(f'{x:.1f}' for x in swarm)} tokens/s")
    print(f"load {load()}: HF generate ...", flush=True)
    hf = bench_hf(folder, prompts, args.repeats)
    print(f"HF generate: {' '.join(f'{x:.1f}' for x in hf)} tokens/s")
    print(f"load {load()}: vLLM offline generate ...", flush=True)
    vllm = bench_vllm(folder, prompts, args.threads, args.repeats)
    if vllm:
        print(f"vLLM generate: {' '.join(f'{x:.1f}' for x in vllm)} tokens/s")
    trl = None if args.no_trl else bench_grpo(folder, args.threads)
    ours = statistics.fmean(swarm)
    parts = [f"swarm_over_hf_generate={ours / statistics.fmean(hf):.3f}",
             f"swarm_over_vllm={ours / statistics.fmean(vllm):.3f}" if vllm else "swarm_over_vllm=nan",
             f"trl_over_swarm={trl:.3f}" if trl is not None else "trl_over_swarm=nan"]
    print(f"load {load()}")
    print("RESULT " + " ".join(parts))


if __name__ == "__main__":
    main()
