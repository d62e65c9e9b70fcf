"""Benchmark: one GRPO iteration (generate, score, update) with our torch backend vs TRL's GRPOTrainer.

Both run in this one process on the same tiny model folder, the same prompts (8 random letters),
the same reward (fraction of 'a' among the completion tokens), the same group size, completion
length, learning rate, constant schedule, no KL term and one update per generated batch. Each side
gets warm-up iterations first; then the seconds per iteration are timed and compared.

Run: ``python tests/bench/bench_vs_trl.py [--prompts 4 --group 8 --max-new 16] [--threads 1]``.
Everything is offline. Wall seconds are the headline (as asked); CPU seconds are printed too because
on a shared machine they move less with other processes' load. At small shapes per-step overhead
dominates and our lean loop wins most; at larger shapes both sides are bound by the same matmuls.
The last line is ``RESULT trl_over_swarm=<TRL mean s/iteration divided by ours>``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend
from swarm.models.tiny import build_tiny

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def make_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(LETTERS) for _ in range(8)) for _ in range(count)]


def reward_of(text: str, max_new: int) -> float:
    return text.count("a") / max_new


def run_swarm(folder: Path, prompts: list[str], args: argparse.Namespace) -> tuple[list[float], list[float], list[float]]:
    """Our loop: generate -> reward -> advantages (verl) -> train_step (verl loss).

    Returns wall seconds and CPU seconds per timed iteration, and the mean reward of every iteration.
    """
    config = TrainConfig(lr=args.lr, grad_clip=1.0, loss_agg_mode="token-mean")
    backend = TorchBackend.from_model(str(folder), config, seed=0)
    times, cpu, rewards = [], [], []
    for it in range(args.warmup + args.iterations):
        batch = prompts[it * args.prompts : (it + 1) * args.prompts]
        start, start_cpu = time.perf_counter(), time.process_time()
        prompt_ids = [backend.tokenizer.encode(p, add_special_tokens=False) for p in batch]
        rows = [ids for ids in prompt_ids for _ in range(args.group)]
        params = [SamplingParams(max_tokens=args.max_new, temperature=1.0)] * len(rows)
        gens = backend.generate(rows, params)
        scores = [reward_of(backend.decode(g.token_ids), args.max_new) for g in gens]
        groups = [str(i // args.group) for i in range(len(rows))]
        advantages = backend.advantages(scores, groups, config)
        samples = [
            TrainSample(p + g.token_ids, [0] * len(p) + [1] * len(g.token_ids), [0.0] * len(p) + g.logprobs, a)
            for p, g, a in zip(rows, gens, advantages)
        ]
        backend.train_step(samples, config)
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if it >= args.warmup:
            times.append(elapsed)
            cpu.append(elapsed_cpu)
        rewards.append(statistics.fmean(scores))
        warm = "(warm-up) " if it < args.warmup else ""
        print(f"swarm iteration {it:2d} {warm}{elapsed:.3f} s (cpu {elapsed_cpu:.3f} s)  reward {rewards[-1]:.3f}")
    return times, cpu, rewards


def run_trl(
    folder: Path, prompts: list[str], args: argparse.Namespace, out_dir: Path
) -> tuple[list[float], list[float], list[float]]:
    """TRL's GRPOTrainer on the same folder, prompts and settings; step times from a callback."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rewards: list[float] = []

    def letter_reward(prompts, completions, **kwargs) -> list[float]:
        scores = [reward_of(c, args.max_new) for c in completions]
        rewards.append(statistics.fmean(scores))
        return scores

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[float] = []
            self._start = self._start_cpu = 0.0

        def on_step_begin(self, *a, **k) -> None:
            self._start, self._start_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k) -> None:
            self.times.append(time.perf_counter() - self._start)
            self.cpu.append(time.process_time() - self._start_cpu)
            it = len(self.times) - 1
            warm = "(warm-up) " if it < args.warmup else ""
            reward = rewards[-1] if rewards else float("nan")
            print(f"trl   iteration {it:2d} {warm}{self.times[-1]:.3f} s (cpu {self.cpu[-1]:.3f} s)  reward {reward:.3f}")

    steps = args.warmup + args.iterations
    config = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_new,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",  # token-mean over the batch, as ours
        temperature=1.0,
        top_p=1.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,
        seed=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[letter_reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts[: steps * args.prompts]}),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return timer.times[args.warmup :], timer.cpu[args.warmup :], rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Defaults are the letters toy (measured: reward 0.003 -> 0.67 in 50 steps) (4 prompts x 8 samples x 16 tokens, lr 1e-3).
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations per side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="distinct prompts per iteration")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (GRPO group)")
    parser.add_argument("--max-new", type=int, default=16, help="max completion tokens")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import verl.trainer.ppo.core_algos  # noqa: F401  (pay the Ray/verl import before timing)

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny(Path(tmp) / "tiny", seed=0)
        prompts = make_prompts((args.warmup + args.iterations) * args.prompts, seed=1)
        print(
            f"shapes: {args.prompts} prompts x {args.group} completions x {args.max_new} tokens, lr {args.lr}, "
            f"threads {args.threads}"
        )
        ours, ours_cpu, our_rewards = run_swarm(folder, prompts, args)
        theirs, theirs_cpu, their_rewards = run_trl(folder, prompts, args, Path(tmp) / "trl")
    ours_mean, theirs_mean = statistics.fmean(ours), statistics.fmean(theirs)
    for name, wall, cpu, rewards in (("swarm", ours, ours_cpu, our_rewards), ("trl", theirs, theirs_cpu, their_rewards)):
        print(
            f"{name:5s}: {statistics.fmean(wall):.3f} s/iteration (median {statistics.median(wall):.3f}, "
            f"cpu {statistics.fmean(cpu):.3f} s), final reward {rewards[-1]:.3f}"
        )
    # CPU seconds are less disturbed by other processes on a shared machine; shown for reference.
    print(f"cpu ratio trl/swarm: {statistics.fmean(theirs_cpu) / statistics.fmean(ours_cpu):.2f}")
    print(f"RESULT trl_over_swarm={theirs_mean / ours_mean:.2f}")


if __name__ == "__main__":
    main()
