"""Benchmark: train-step tokens and wall time with timeline merging on and off (issue 3).

Multi-turn episodes at 1, 4, 8 and 16 turns are built with the real tiny backend the way the server
builds them: render the conversation with the chat template, generate, append the reply as the
assistant's message plus a new user message, re-render — each call recorded into two
``EpisodeTrace`` objects, one merging and one not. Both sample sets then go through the same
``train_step`` of the same backend, alternating, and the median times are compared.

A random model emits arbitrary bytes that do not survive a text round trip, so the model first gets
a short supervised warm-up (ASCII answers); forks (drift) are reported so a broken merge is visible.

Ends with ``RESULT speedup_8=<unmerged_s/merged_s at 8 turns> token_ratio_8=<unmerged/merged tokens>``
(target: speedup_8 >= 3 and >= 90% of token_ratio_8).

    .venv/bin/python tests/bench/bench_merge.py [--episodes 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from swarm.backends import SamplingParams, TrainSample, load_backend
from swarm.models.tiny import build_tiny
from swarm.protocol import SftExample
from swarm.server import ServerConfig
from swarm.server.records.timeline import EpisodeTrace
from swarm.server.training.sft import minibatches, sft_samples

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in a few words."}


def _user(episode: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Episode {episode}, turn {turn}: next step?"}


def _warm_up(backend, config: ServerConfig) -> None:
    examples = [SftExample(messages=[SYSTEM, _user(e, t)], completion=f"step {t} done for {e}")
                for e in range(4) for t in range(4)]
    samples = sft_samples(backend, examples)
    sft_config = config.model_copy(update={"lr": 0.02})
    for batch in minibatches(samples, 16, 25):
        backend.supervised_step(batch, sft_config)


def _episodes(backend, turns: int, count: int, max_tokens: int) -> tuple[list[EpisodeTrace], list[EpisodeTrace]]:
    """``count`` episodes of ``turns`` calls each, generated in one batch per turn."""
    merged = [EpisodeTrace(merge=True) for _ in range(count)]
    unmerged = [EpisodeTrace(merge=False) for _ in range(count)]
    histories = [[SYSTEM] for _ in range(count)]
    for turn in range(turns):
        for e, history in enumerate(histories):
            history.append(_user(e, turn))
        prompts = [backend.render_prompt(h, None) for h in histories]
        params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * e + turn) for e in range(count)]
        for e, gen in enumerate(backend.generate(prompts, params)):
            for trace in (merged[e], unmerged[e]):
                trace.record(prompts[e], [(gen.token_ids, gen.logprobs)], backend.policy_version, 1.0)
            histories[e].append({"role": "assistant", "content": backend.decode(gen.token_ids)})
    return merged, unmerged


def _samples(traces: list[EpisodeTrace], advantages: list[float]) -> list[TrainSample]:
    return [s for trace, adv in zip(traces, advantages) for s in trace.samples(adv)]


def _time_step(backend, samples: list[TrainSample], config: ServerConfig) -> float:
    started = time.perf_counter()
    backend.train_step(samples, config)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, nargs="*", default=[1, 4, 8, 16])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    config = ServerConfig(lr=1e-6)  # tiny steps: the weights barely move between timed repeats
    rng = random.Random(0)
    results: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        backend = load_backend(str(build_tiny(Path(tmp) / "tiny", seed=0)), config, seed=0)
        _warm_up(backend, config)
        print(f"{'turns':>5} {'tok_merged':>10} {'tok_unmerged':>12} {'token_ratio':>11} "
              f"{'s_merged':>9} {'s_unmerged':>10} {'speedup':>8} {'forks':>6}")
        for turns in args.turns:
            merged, unmerged = _episodes(backend, turns, args.episodes, args.max_tokens)
            advantages = [rng.choice((-1.0, 1.0)) for _ in range(args.episodes)]
            merged_samples, unmerged_samples = _samples(merged, advantages), _samples(unmerged, advantages)
            tokens_m = sum(len(s.tokens) for s in merged_samples)
            tokens_u = sum(len(s.tokens) for s in unmerged_samples)
            _time_step(backend, merged_samples, config)  # warm-up (allocator, verl import)
            times_m, times_u = [], []
            for _ in range(args.repeats):  # alternate so machine noise hits both sides alike
                times_m.append(_time_step(backend, merged_samples, config))
                times_u.append(_time_step(backend, unmerged_samples, config))
            s_m, s_u = statistics.median(times_m), statistics.median(times_u)
            forks = sum(t.drift_forks for t in merged)
            results[turns] = (s_u / s_m, tokens_u / tokens_m)
            print(f"{turns:>5} {tokens_m:>10} {tokens_u:>12} {tokens_u / tokens_m:>11.2f} "
                  f"{s_m:>9.3f} {s_u:>10.3f} {s_u / s_m:>8.2f} {forks:>6}", flush=True)
    speedup_8, ratio_8 = results.get(8, (float("nan"), float("nan")))
    print(f"RESULT speedup_8={speedup_8:.2f} token_ratio_8={ratio_8:.2f}")


if __name__ == "__main__":
    main()
