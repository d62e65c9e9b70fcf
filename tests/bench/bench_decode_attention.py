"""Benchmark: the torch engine's generation with grouped decode attention vs transformers' repeated keys.

One ``TorchBackend`` (default: SmolLM2-135M-Instruct from its registry package, 9 query heads over 3
key/value heads) generates the same greedy rows twice per repeat, alternating: once with
``attention.grouped_decode_attention`` (the engine's default for grouped heads) and once with the
model switched back to transformers' SDPA, which repeats every key/value head before each decode
step's attention. Same prompts, same tokens (checked), so the work is the same; the best time of each
side is compared.

Ends with ``RESULT grouped_over_repeat=<repeat_s / grouped_s> tokens_equal=<1|0> max_logprob_diff=<x>``
(aim: > 1 wherever rows x columns make the cache copy count; equal tokens always).

    .venv/bin/python tests/bench/bench_decode_attention.py [--model smollm2-135m] [--rows 16]
        [--prompt-tokens 400] [--max-tokens 48] [--repeats 3] [--decode-cache dynamic]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from swarm.backends import SamplingParams, TrainConfig
from swarm.backends.torch import TorchBackend
from swarm.backends.torch.attention import GROUPED_SDPA


def _prompts(backend: TorchBackend, rows: int, tokens: int) -> list[list[int]]:
    """Chat prompts of about ``tokens`` tokens, of slightly different lengths (rows are padded)."""
    prompts = []
    for row in range(rows):
        notes = " ".join(f"Note {k}: {k * (row + 3) % 97} boxes." for k in range(tokens))
        ids = backend.render_prompt([{"role": "user", "content": f"Sum up the notes. {notes}"}], None)
        prompts.append(ids[-(tokens - 7 * (row % 5)):])
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-cache", default="dynamic", choices=["dynamic", "static"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    backend = TorchBackend.from_model(args.model, TrainConfig(), seed=0, decode_cache=args.decode_cache)
    if backend.model.config._attn_implementation != GROUPED_SDPA:
        raise SystemExit(f"{args.model} has no grouped key/value heads (or does not use SDPA): nothing to compare")
    prompts = _prompts(backend, args.rows, args.prompt_tokens)
    # Greedy: a sampled row may draw a different far-tail token when float rounding moves its CDF by 1e-6.
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True) for _ in range(args.rows)]
    print(f"{args.model}: {args.rows} rows x ~{args.prompt_tokens} prompt tokens x {args.max_tokens} new tokens, "
          f"{args.decode_cache} cache, {args.threads} threads")

    times: dict[str, list[float]] = {GROUPED_SDPA: [], "sdpa": []}
    outputs = {}
    for repeat in range(args.repeats):
        for implementation in (GROUPED_SDPA, "sdpa") if repeat % 2 == 0 else ("sdpa", GROUPED_SDPA):
            backend.model.set_attn_implementation(implementation)
            started = time.perf_counter()
            outputs[implementation] = backend.generate(prompts, params)
            times[implementation].append(time.perf_counter() - started)
            print(f"  repeat {repeat} {implementation:>12}: {times[implementation][-1]:.2f} s", flush=True)

    grouped, repeated = outputs[GROUPED_SDPA], outputs["sdpa"]
    equal = all(a.token_ids == b.token_ids for a, b in zip(grouped, repeated))
    worst = max(abs(x - y) for a, b in zip(grouped, repeated) for x, y in zip(a.logprobs, b.logprobs))
    best_grouped, best_repeated = min(times[GROUPED_SDPA]), min(times["sdpa"])
    print(f"best: grouped {best_grouped:.2f} s, repeated keys {best_repeated:.2f} s")
    print(f"RESULT grouped_over_repeat={best_repeated / best_grouped:.3f} tokens_equal={int(equal)} "
          f"max_logprob_diff={worst:.2e}")


if __name__ == "__main__":
    main()
