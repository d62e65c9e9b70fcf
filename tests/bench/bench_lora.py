"""Benchmark: one GRPO step with LoRA (rank 16 by default) against full fine-tuning, side by side.

Both variants load the same model (``--model``, default ``smollm2-135m``; ``tiny`` for a smoke run)
through ``TorchBackend`` and run the same steps: generate a batch (``--prompts`` x ``--group`` rows,
``--tokens`` new tokens each, temperature 1), score it with seeded random rewards (scoring is not
what is measured), compute GRPO advantages, take one policy update (``train_step``) and publish
(``export_weights``: under LoRA the merged weights, as ``--engine vllm`` gets them). One untimed
warm-up step, then ``--steps`` timed ones (medians). Each variant runs in its own process, so its
peak RSS (``ru_maxrss``) is its own: LoRA saves the full model's gradients and AdamW moments (about
3x the weights in fp32) and pays for the adapters' extra matmuls in every forward pass.

Ends with ``RESULT lora_step_s_ratio=<lora / full step seconds> lora_peak_rss_ratio=<lora / full peak RSS>
lora_step_cpu_s_ratio=<lora / full step CPU seconds>``: the variants run one after the other, so on a
shared machine their wall times meet different loads; the CPU seconds each process spent do not.

    .venv/bin/python tests/bench/bench_lora.py [--model smollm2-135m] [--rank 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = ["What is 7 + 5?", "Name a prime number above 20.", "Spell 'cat' backwards.", "What is 12 x 3?",
             "Give a word that rhymes with 'tree'.", "What is 100 - 37?", "Name a colour of the sky.", "What is 9 / 3?"]


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def child(args: argparse.Namespace) -> None:
    """One variant in this process: prints one JSON line of timings and peak RSS."""
    import torch

    from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
    from swarm.backends.torch import TorchBackend

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rank = args.rank if args.child == "lora" else 0
    config = TrainConfig(lr=args.lr, lora_rank=rank, lora_alpha=2 * max(rank, 1))
    backend = TorchBackend.from_model(args.model, config, seed=0)
    loaded_gb = _peak_gb()
    rng = random.Random(0)
    prompts = [backend.render_prompt([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], None)
               for i in range(args.prompts)]
    timings: dict[str, list[float]] = {"generate_s": [], "train_s": [], "publish_s": [], "step_s": [], "step_cpu_s": []}
    for step in range(args.steps + 1):
        rows = [p for p in prompts for _ in range(args.group)]
        params = [SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=1000 * step + i, ignore_eos=True)
                  for i in range(len(rows))]
        begin, begin_cpu = time.perf_counter(), time.process_time()
        gens = backend.generate(rows, params)
        generated = time.perf_counter()
        groups = [str(i // args.group) for i in range(len(rows))]
        advantages = backend.advantages([rng.random() for _ in rows], groups, config)
        samples = [TrainSample(list(p) + g.token_ids, [0] * len(p) + [1] * len(g.token_ids),
                               [0.0] * len(p) + g.logprobs, advantage=a, temperature=1.0)
                   for p, g, a in zip(rows, gens, advantages)]
        metrics = backend.train_step(samples, config)
        trained = time.perf_counter()
        published = backend.export_weights()
        done, done_cpu = time.perf_counter(), time.process_time()
        del published
        if step == 0:
            continue  # warm-up
        for key, seconds in (("generate_s", generated - begin), ("train_s", trained - generated),
                             ("publish_s", done - trained), ("step_s", done - begin),
                             ("step_cpu_s", done_cpu - begin_cpu)):
            timings[key].append(seconds)
    trainable = sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    print(json.dumps({"variant": args.child, "rank": rank, "loaded_gb": loaded_gb, "peak_gb": _peak_gb(),
                      "trainable": trainable, "logprob_diff": metrics["train/rollout_logprob_diff"],
                      **{key: statistics.median(values) for key, values in timings.items()}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="any swarm --model name (tiny for a smoke run)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per row (ignore_eos)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (both variants)")
    parser.add_argument("--child", choices=("lora", "full"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results = {}
    for variant in ("full", "lora"):
        argv = [sys.executable, __file__, "--child", variant, *sys.argv[1:]]
        out = subprocess.run(argv, check=True, capture_output=True, text=True)
        r = results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{variant} (rank {r['rank']}): {r['trainable']:,} trainable parameters; RSS loaded {r['loaded_gb']:.2f} GB, "
              f"peak {r['peak_gb']:.2f} GB; step {r['step_s']:.2f} s = generate {r['generate_s']:.2f} + train "
              f"{r['train_s']:.2f} + publish {r['publish_s']:.3f}; recorded vs recomputed log-prob diff "
              f"{r['logprob_diff']:.1e}")
    lora, full = results["lora"], results["full"]
    print(f"model {args.model}, {args.prompts} x {args.group} rows x {args.tokens} tokens, {args.threads} threads")
    print(f"RESULT lora_step_s_ratio={lora['step_s'] / full['step_s']:.3f} "
          f"lora_peak_rss_ratio={lora['peak_gb'] / full['peak_gb']:.3f} "
          f"lora_step_cpu_s_ratio={lora['step_cpu_s'] / full['step_cpu_s']:.3f}")


if __name__ == "__main__":
    main()
