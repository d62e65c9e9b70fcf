"""Where and in what dtype the torch engine runs (``--device``/``--dtype``), checked without a GPU: fake
device lists for the choice, the CPU's bfloat16 for the mixed-precision path, and the static slot cache
growing past its first size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend
from swarm.devices import split_gpus, torch_device, torch_dtype

FOUR = ["0", "1", "2", "3"]


@pytest.mark.parametrize(("engine", "trainer", "flags", "expected"), [
    ("torch", "torch", {}, "cuda:0"),  # nothing given away: the first GPU
    ("vllm", "torch", {}, "cuda:0"),  # vLLM takes the last; the torch trainer the first free one
    ("vllm", "torch", {"generator": "0"}, "cuda:1"),
    ("torch", "verl", {}, "cpu"),  # verl's workers take every GPU by default
    ("vllm", "verl", {"generator": "3", "trainer": "0,1,2"}, "cpu"),  # every GPU given away
    ("torch", "verl", {"trainer": "0,1"}, "cuda:2"),
])
def test_auto_never_takes_a_gpu_the_split_gave_away(engine, trainer, flags, expected) -> None:
    vllm, verl = engine == "vllm", trainer == "verl"
    split = split_gpus(FOUR, vllm=vllm, verl=verl, **flags)
    device = torch_device("auto", visible=FOUR, split=split, vllm_child=vllm, verl=verl)
    given_away = set(split.generator if vllm else ()) | set(split.trainer if verl else ())
    assert device == expected
    if device != "cpu":
        assert FOUR[int(device.split(":")[1])] not in given_away


def test_explicit_devices_and_dtypes_are_checked() -> None:
    none = split_gpus([])
    assert torch_device("auto", visible=[], split=none, vllm_child=False, verl=False) == "cpu"
    assert torch_device("cuda", visible=FOUR, split=none, vllm_child=False, verl=False) == "cuda:0"
    assert torch_device("cuda:3", visible=FOUR, split=none, vllm_child=False, verl=False) == "cuda:3"
    for bad in ("cuda:4", "gpu", "cuda:x"):
        with pytest.raises(ValueError, match="device"):
            torch_device(bad, visible=FOUR, split=none, vllm_child=False, verl=False)
    assert torch_dtype("auto", "cuda:0") == "bfloat16"
    assert torch_dtype("auto", "cuda:0", bf16_supported=False) == "float32"
    assert torch_dtype("auto", "cpu") == "float32"
    assert torch_dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("float16", "cpu")


def test_bfloat16_serves_a_bf16_copy_and_trains_fp32_master_weights(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, dtype="bfloat16")
    assert backend.dtype == "bfloat16" and backend.device == "cpu"
    assert next(backend.model.parameters()).dtype == torch.float32
    assert next(backend.serving.parameters()).dtype == torch.bfloat16
    prompt = backend.encode("hello")
    generation = backend.generate([prompt], [SamplingParams(max_tokens=8, seed=1)])[0]
    sample = TrainSample(prompt + generation.token_ids, [0] * len(prompt) + [1] * len(generation.token_ids),
                         [0.0] * len(prompt) + generation.logprobs, 1.0)
    before = next(backend.serving.parameters()).clone()
    metrics = backend.train_step([sample], TrainConfig(lr=1e-2))
    assert all(v == v for v in metrics.values())  # no NaN under autocast
    master = next(backend.model.parameters())
    served = next(backend.serving.parameters())
    assert master.dtype == torch.float32 and not torch.equal(served, before)
    assert torch.equal(served, master.to(torch.bfloat16))  # the served copy follows every update


def test_the_slot_cache_grows_past_its_first_size_and_matches_the_growing_cache(tiny_dir: Path) -> None:
    static = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache="static")
    dynamic = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache="dynamic")
    pool = static._setup.slots
    assert pool is not None and (pool.slots, pool.length) == (8, 256)
    prompts = [static.encode("a long prompt " * (20 if i == 0 else 1) + str(i)) for i in range(12)]
    params = [SamplingParams(max_tokens=12, seed=i) for i in range(12)]
    for a, b in zip(static.generate(prompts, params), dynamic.generate(prompts, params)):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert pool.slots == 16 and pool.length == 512 and pool.top == 0  # grown, and every slot given back


def test_compiled_decoding_compiles_once_as_the_pool_grows_and_matches_the_growing_cache(tiny_dir: Path) -> None:
    """``--decode-cache compiled``: one compile serves every bucket, also after a join grew the pool
    inside the sampler's inference mode (its new buffers once became a second compile)."""
    from torch._dynamo.utils import counters

    compiled = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache="compiled")
    dynamic = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0, decode_cache="dynamic")
    pool = compiled._setup.slots
    assert pool is not None
    graphs_before = counters["stats"]["unique_graphs"]
    for rows in (3, 12, 5):  # buckets of 4, 16 and 8 rows; the first call already outgrows 256 columns
        prompts = [compiled.encode("a prompt " * (1 + i % 5) + str(i)) for i in range(rows)]
        params = [SamplingParams(max_tokens=150 if i == 0 else 20, seed=i) for i in range(rows)]
        for a, b in zip(compiled.generate(prompts, params), dynamic.generate(prompts, params)):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert (pool.slots, pool.length) == (16, 512)  # grown twice
    assert counters["stats"]["unique_graphs"] - graphs_before == 1


def test_the_gpu_check_skips_on_a_cpu(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "tests/gpu/torch_engine.sh", str(tmp_path)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("SKIP"), done.stdout + done.stderr
