"""Benchmark on GPU: seconds per GRPO step, ``swarm serve --engine vllm --trainer verl`` vs TRL + vLLM.

The same shapes on both sides (the letters toy: 4 prompts x 8 samples x 16 tokens, lr 1e-3, no KL,
one update per batch, the tiny preset). Ours: a real server with the letters client (sync mode, so
both sides train on-policy), timed from the committed steps' timestamps after ``--warmup`` steps.
TRL's: ``GRPOTrainer`` with ``use_vllm=True`` (colocated vLLM) on the same model folder, timed by a
step callback, in its own Python (``--trl-python``, default ``.venv-trl``): TRL 1.16's vLLM extra pins
vllm <= 0.31, which resolves beside neither our ``.venv`` (verl pins transformers < 5.11) nor
``.venv-vllm`` (vllm 0.32). Build it with::

    python3 -m venv .venv-trl && .venv-trl/bin/pip install 'trl[vllm]==1.16.*' datasets

Run: ``.venv/bin/python tests/bench/bench_vs_trl_gpu.py [--iterations 10 --warmup 2]``. Without CUDA
it prints ``SKIP: ...`` and exits 0; without the TRL Python it measures our side only and says so.
Ends with ``RESULT swarm_s_per_step=<s>`` and, when TRL ran, ``RESULT trl_vllm_over_swarm=<TRL s/step
divided by ours>``. Not run where it was written (no GPU there).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def trl_side(folder: str, steps: int, prompts: int, group: int, max_new: int, lr: float) -> list[float]:
    """TRL's GRPOTrainer with colocated vLLM on ``folder`` (runs inside the TRL Python); seconds per step."""
    import random

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rng = random.Random(1)
    texts = ["".join(rng.choice(LETTERS) for _ in range(8)) for _ in range(steps * prompts)]
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k) -> None:
            times.append(time.perf_counter() - self.start)

    def letter_reward(prompts, completions, **kwargs) -> list[float]:
        return [c.count("a") / max_new for c in completions]

    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.padding_side = "left"
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-gpu-"), per_device_train_batch_size=prompts * group,
        gradient_accumulation_steps=1, num_generations=group, max_completion_length=max_new, learning_rate=lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
        num_iterations=1, loss_type="dapo", temperature=1.0, top_p=1.0, max_steps=steps, logging_steps=1,
        save_strategy="no", report_to="none", bf16=True, disable_tqdm=True, seed=0, shuffle_dataset=False,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
    )
    GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(folder), reward_funcs=[letter_reward], args=config,
                train_dataset=Dataset.from_dict({"prompt": texts}), processing_class=tokenizer,
                callbacks=[StepTimer()]).train()
    return times


def swarm_side(steps: int, work: Path) -> list[float]:
    """Seconds between consecutive committed steps of ``swarm serve --engine vllm --trainer verl``."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import smoke_run

    server = smoke_run._start(work, "swarm", "tiny", [], timeout=900)
    try:
        rows = smoke_run._train(server, work, "swarm", steps, timeout=1800)
    finally:
        server.remember_tree()
        smoke_run._stop_server(server.proc, server)
    return [b["time"] - a["time"] for a, b in itertools.pairwise(rows)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    parser.add_argument("--trl-side", help=argparse.SUPPRESS)  # internal: run TRL's side on this folder
    args = parser.parse_args()
    if args.trl_side:  # inside the TRL Python: the shapes of the letters config
        print(json.dumps(trl_side(args.trl_side, args.warmup + args.iterations, 4, 8, 16, 1e-3)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible; bench_vs_trl_gpu.py compares GPU training and needs a GPU")
        return 0
    from swarm.models.tiny import build_tiny

    with tempfile.TemporaryDirectory(prefix="bench-trl-gpu-") as tmp:
        ours = swarm_side(args.warmup + args.iterations + 1, Path(tmp))[args.warmup:]
        print(f"swarm: {statistics.fmean(ours):.3f} s/step over {len(ours)} steps")
        print(f"RESULT swarm_s_per_step={statistics.fmean(ours):.4f}")
        if not Path(args.trl_python).is_file():
            print(f"SKIP trl side: no TRL Python at {args.trl_python} (see this script's docstring)")
            return 0
        folder = build_tiny(Path(tmp) / "tiny", seed=0)
        done = subprocess.run([args.trl_python, __file__, "--trl-side", str(folder), "--iterations",
                               str(args.iterations), "--warmup", str(args.warmup)],
                              capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            print(f"TRL side failed:\n{done.stderr[-3000:]}")
            return 1
        theirs = json.loads(done.stdout.strip().splitlines()[-1])[args.warmup:]
    print(f"trl+vllm: {statistics.fmean(theirs):.3f} s/step over {len(theirs)} steps")
    print(f"RESULT trl_vllm_over_swarm={statistics.fmean(theirs) / statistics.fmean(ours):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
