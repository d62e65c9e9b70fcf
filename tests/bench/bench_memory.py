"""Benchmark: peak memory of training steps on a Qwen-sized vocabulary, chunked vs full logits.

A random Qwen2 model with Qwen's 151,936-row vocabulary, hidden 64 and 2 layers (the ``tiny-bpe``
preset when it can be built here, else the same shape straight from transformers' ``Qwen2Config``
with a stand-in tokenizer of as many ids) runs, through ``TorchBackend``, one supervised step (the
warm-up) and one policy train step on a batch of about 4k tokens. Each variant runs in its own
process, so its peak RSS (``ru_maxrss``) is its own:

- ``chunked``: today's training log-probs (``swarm.backends.torch.logprobs``, chunks of positions);
- ``full``: the old computation (full ``(n, L, V)`` logits and ``log_softmax``), reached by setting
  ``logprobs.CHUNK_LOGITS = None`` — a switch kept for this benchmark only.

Target (the issue): the warm-up and a train step on a ~4k-token batch keep the peak under 1.5 GB.
Ends with ``RESULT peak_gb_chunked=<GB> peak_gb_full=<GB> full_over_chunked=<ratio>``.

    .venv/bin/python tests/bench/bench_memory.py [--rows 8] [--length 512]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = 151936
SHAPE = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 176, "max_position_embeddings": 4096}


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _stand_in_backend(seed: int):
    """The preset's shape without its tokenizer: a word-level tokenizer of ``VOCAB`` ids."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from swarm.backends.torch import TorchBackend

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)).eval()
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")),
                                        eos_token="t1", pad_token="t0")
    return TorchBackend(model, tokenizer, model_name="stand-in", seed=seed)


def _backend(work: Path):
    from swarm.backends.base import TrainConfig
    from swarm.backends.torch import TorchBackend

    try:
        return TorchBackend.from_model("tiny-bpe", TrainConfig(), seed=0, cache_dir=work / "tiny-bpe"), "tiny-bpe"
    except (ValueError, RuntimeError, ImportError) as exc:
        print(f"tiny-bpe preset unavailable ({exc}); using a Qwen2Config model of the same shape", file=sys.stderr)
        return _stand_in_backend(0), "qwen2-config"


def child(variant: str, rows: int, length: int, work: Path) -> None:
    import torch

    from swarm.backends.base import TrainConfig, TrainSample
    from swarm.backends.torch import logprobs

    if variant == "full":
        logprobs.CHUNK_LOGITS = None
    backend, source = _backend(work)
    loaded_gb = _peak_gb()
    generator = torch.Generator().manual_seed(1)
    samples = []
    for i in range(rows):
        tokens = torch.randint(0, backend.vocab_size, (length,), generator=generator).tolist()
        half = length // 2
        samples.append(TrainSample(tokens, [0] * half + [1] * (length - half), [0.0] * length,
                                   advantage=1.0 if i % 2 else -1.0))
    config = TrainConfig(lr=1e-4)
    start = time.perf_counter()
    sft = backend.supervised_step(samples, config)
    warm_s = time.perf_counter() - start
    start = time.perf_counter()
    backend.train_step(samples, config)
    train_s = time.perf_counter() - start
    print(json.dumps({"variant": variant, "source": source, "tokens": rows * length, "loaded_gb": loaded_gb,
                      "peak_gb": _peak_gb(), "warm_up_s": warm_s, "train_s": train_s, "sft_loss": sft["sft/loss"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--child", choices=("chunked", "full"), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rows, args.length, args.work)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for variant in ("chunked", "full"):
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--rows", str(args.rows),
                                  "--length", str(args.length), "--work", tmp],
                                 check=True, capture_output=True, text=True)
            results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
            r = results[variant]
            print(f"{variant}: model {r['source']}, {r['tokens']} tokens; RSS after loading {r['loaded_gb']:.2f} GB, "
                  f"peak {r['peak_gb']:.2f} GB; warm-up step {r['warm_up_s']:.2f} s, train step {r['train_s']:.2f} s; "
                  f"sft loss {r['sft_loss']:.4f}")
    chunked, full = results["chunked"]["peak_gb"], results["full"]["peak_gb"]
    print(f"target: peak under 1.5 GB -> {'met' if chunked < 1.5 else 'NOT met'}")
    print(f"RESULT peak_gb_chunked={chunked:.2f} peak_gb_full={full:.2f} full_over_chunked={full / chunked:.2f}")


if __name__ == "__main__":
    main()
