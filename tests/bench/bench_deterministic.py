"""Benchmark: a GRPO step in deterministic mode against the default, side by side in one process.

Two ``TorchBackend``s load the same model (``--model``, default ``tiny``; ``smollm2-135m`` for a real
one) and take turns, step by step, so both meet the same machine load: generate a batch (``--prompts``
x ``--group`` rows, ``--tokens`` new tokens each, temperature 1), score it with seeded random rewards
(scoring is not what is measured), compute GRPO advantages and take one policy update. The default
variant's rows carry a ``seed`` each and share one batched forward per decode step; the deterministic
variant's rows carry a counter-based ``noise_key`` (``swarm serve --deterministic``,
``swarm.backends.noise``), so each row decodes in a batch of its own. The update is the same code for
both (the server orders the samples; that costs nothing here). One untimed warm-up step each, then
``--steps`` timed ones (medians).

Ends with ``RESULT deterministic_step_s_ratio=<deterministic / default step seconds>
deterministic_generate_s_ratio=<the same for generation alone>``.

    .venv/bin/python tests/bench/bench_deterministic.py [--model tiny] [--prompts 4] [--group 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = ["What is 7 + 5?", "Name a prime number above 20.", "Spell 'cat' backwards.", "What is 12 x 3?",
             "Give a word that rhymes with 'tree'.", "What is 100 - 37?", "Name a colour of the sky.", "What is 9 / 3?"]
VARIANTS = ("default", "deterministic")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="any swarm --model name")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per row (ignore_eos)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant after one warm-up step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    import torch

    from swarm.backends import noise
    from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
    from swarm.backends.torch import TorchBackend

    torch.set_num_threads(args.threads)
    config = TrainConfig(lr=1e-5)
    backends = {v: TorchBackend.from_model(args.model, config, seed=0) for v in VARIANTS}
    prompts = [backends["default"].render_prompt([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], None)
               for i in range(args.prompts)]
    rows = [p for p in prompts for _ in range(args.group)]
    groups = [str(i // args.group) for i in range(len(rows))]
    rng = random.Random(0)
    timings: dict[str, dict[str, list[float]]] = {v: {"generate_s": [], "step_s": []} for v in VARIANTS}
    for step in range(args.steps + 1):
        for variant, backend in backends.items():
            keyed = variant == "deterministic"
            params = [SamplingParams(max_tokens=args.tokens, temperature=1.0, ignore_eos=True, seed=1000 * step + i,
                                     noise_key=noise.sample_key(0, "bench", step, i) if keyed else None)
                      for i in range(len(rows))]
            begin = time.perf_counter()
            gens = backend.generate(rows, params)
            generated = time.perf_counter()
            advantages = backend.advantages([rng.random() for _ in rows], groups, config)
            samples = [TrainSample(list(p) + g.token_ids, [0] * len(p) + [1] * len(g.token_ids),
                                   [0.0] * len(p) + g.logprobs, advantage=a, temperature=1.0)
                       for p, g, a in zip(rows, gens, advantages)]
            backend.train_step(samples, config)
            done = time.perf_counter()
            if step:  # step 0 warms up
                timings[variant]["generate_s"].append(generated - begin)
                timings[variant]["step_s"].append(done - begin)
    median = {v: {k: statistics.median(xs) for k, xs in t.items()} for v, t in timings.items()}
    for variant in VARIANTS:
        m = median[variant]
        print(f"{variant}: step {m['step_s']:.3f} s (generate {m['generate_s']:.3f} s)")
    print(f"model {args.model}, {args.prompts} x {args.group} rows x {args.tokens} tokens, {args.threads} threads, "
          f"{args.steps} steps each, interleaved")
    det, base = median["deterministic"], median["default"]
    print(f"RESULT deterministic_step_s_ratio={det['step_s'] / base['step_s']:.3f} "
          f"deterministic_generate_s_ratio={det['generate_s'] / base['generate_s']:.3f}")


if __name__ == "__main__":
    main()
