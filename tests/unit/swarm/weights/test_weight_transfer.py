"""Choosing the weight transfer safely, and the per-parameter streaming source the NCCL path sends from.

No GPU here: the choice is checked against this server's real environment (vLLM is not importable in
``.venv``) and a pretended CUDA; the streaming source runs on CPU tensors, in this process and, for
vLLM's side of the contract, inside ``.venv-vllm`` against vLLM 0.32's own checks, packing and
unpacking code (the bytes an NCCL broadcast would carry).
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch

from swarm.devices import GpuSplit, split_gpus
from swarm.weights.nccl import ParamStream, probe_here
from swarm.weights.transfer import SenderProbe, choose_transfer

ROOT = Path(__file__).resolve().parents[4]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
APART = split_gpus(["0", "1", "2", "3"])  # vLLM on GPU 3, the trainer on 0-2
READY = SenderProbe(where="the verl workers", cuda=True, vllm="0.32.0")


def test_auto_picks_disk_when_vllm_is_not_importable_where_the_sender_runs() -> None:
    probe = probe_here("the server process", cuda=True)  # pretend CUDA: the import check is real
    assert probe.vllm is None and "vllm" in (probe.problem or "")
    choice = choose_transfer("auto", probe, APART)
    assert choice.kind == "disk"
    assert choice.reason.startswith("auto: vLLM is not importable in the server process")
    with pytest.raises(ValueError, match="nccl cannot work here: vLLM is not importable"):
        choose_transfer("nccl", probe, APART)
    # This machine as it is: no CUDA at all.
    assert choose_transfer("auto", probe_here("the server process"), GpuSplit()).reason == \
        "auto: no CUDA in the server process"


def test_auto_picks_nccl_only_when_everything_holds() -> None:
    assert choose_transfer("auto", READY, APART).kind == "nccl"
    assert choose_transfer("disk", READY, APART).kind == "disk"
    shared = split_gpus(["0"])  # both on GPU 0: NCCL refuses two ranks on one device
    assert "shares GPU(s) 0" in choose_transfer("auto", READY, shared).reason
    newer = SenderProbe(where="the verl workers", cuda=True, vllm="0.33.1")
    assert "targets vLLM 0.32." in choose_transfer("auto", newer, APART).reason
    with pytest.raises(ValueError):
        choose_transfer("fast", READY, APART)


def test_the_choice_is_logged_and_shown_in_the_generator_status(tiny_dir: Path, tmp_path: Path, caplog) -> None:
    from swarm.backends.vllm import VllmGenerator
    from swarm.weights.wiring import transfer_options

    class NoCudaTrainer:  # a trainer without a sender of its own: the server process would send
        pass

    with caplog.at_level(logging.INFO, logger="swarm.weights.wiring"):
        options = transfer_options("auto", NoCudaTrainer(), GpuSplit())
    assert "transfer" not in options  # the default: disk
    assert "weight transfer into vLLM: disk (auto: no CUDA in the server process)" in caplog.text
    generator = VllmGenerator.attach("http://127.0.0.1:9", tiny_dir, tmp_path, **options)  # never started
    info = generator.describe()
    assert info["weight_transfer"] == "disk" and info["weight_transfer_reason"] == "auto: no CUDA in the server process"
    attached = transfer_options("auto", NoCudaTrainer(), GpuSplit(), attached=True)
    assert "devices are unknown" in attached["transfer_reason"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 50, bias=False))


def test_param_stream_yields_one_gathered_bf16_parameter_at_a_time() -> None:
    model = _model()
    stream = ParamStream(model.named_parameters)
    meta = stream.metadata()
    assert stream.materialized == 0  # metadata gathers nothing
    names = [n for n, _ in model.named_parameters()]
    assert [m.name for m in meta] == names and all(m.dtype == torch.bfloat16 for m in meta)
    for seen, ((name, tensor), m, (_, param)) in enumerate(zip(stream, meta, model.named_parameters(), strict=True), 1):
        assert stream.materialized == seen  # produced lazily, one parameter per step
        assert (name, tensor.dtype, tuple(tensor.shape)) == (m.name, m.dtype, m.shape)
        assert torch.equal(tensor, param.detach().to(torch.bfloat16)) and tensor.is_contiguous()
    # A send that failed half-way drains the rest of its pass (on FSDP, the peers' gathers complete).
    partial = iter(stream)
    next(partial)
    assert stream.drain() == len(names) - 1 and stream.drain() == 0
    ints = ParamStream(lambda: [("ids", torch.arange(4))])
    assert ints.metadata()[0].dtype == torch.int64  # only floating tensors are cast


def test_disk_path_writes_bf16_when_asked(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from swarm.weights.folder import write_weights_folder

    weights = {n: p.detach() for n, p in _model().named_parameters()}
    folder = write_weights_folder(weights, tiny_dir, tmp_path, 3, dtype="bfloat16")
    written = load_file(str(folder / "model.safetensors"))
    assert {t.dtype for t in written.values()} == {torch.bfloat16} and (folder / "config.json").is_file()
    assert torch.equal(written["1.weight"], weights["1.weight"].to(torch.bfloat16))
    plain = load_file(str(write_weights_folder(weights, tiny_dir, tmp_path, 4) / "model.safetensors"))
    assert plain["1.weight"].dtype == torch.float32  # the CPU path is unchanged


_VLLM_SIDE = """
import json, math, sys, torch
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine, NCCLWeightTransferUpdateInfo
from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor
from swarm.weights.nccl import ParamStream

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(300, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 300))
stream = ParamStream(model.named_parameters)
meta = stream.metadata()
# The update info the sender posts to vLLM, built as vLLM's engine builds it.
info = NCCLWeightTransferUpdateInfo(names=[m.name for m in meta], dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                                    shapes=[list(m.shape) for m in meta])
buffer = 20_000  # small buckets: several chunks
pairs = NCCLTrainerWeightTransferEngine._checked_iter(stream, meta)  # vLLM's own metadata/iteration check
received, chunks, most_materialized = {}, 0, 0
expected = iter(zip(info.names, info.shapes, info.dtype_names))
while (chunk := pack_tensors(pairs, lambda item: item[1], buffer)) is not None:
    chunks += 1
    # The receiver cuts its chunk from the metadata alone (as packed_nccl_broadcast_consumer does).
    names, shapes, dtypes, sizes, total = [], [], [], [], 0
    while total <= buffer:
        try:
            name, shape, dtype_name = next(expected)
        except StopIteration:
            break
        dtype = getattr(torch, dtype_name)
        names.append(name); shapes.append(shape); dtypes.append(dtype)
        sizes.append(math.prod(shape) * dtype.itemsize); total += sizes[-1]
    assert chunk.packed_tensor.numel() == total, (chunk.packed_tensor.numel(), total)
    received.update(unpack_tensor(chunk.packed_tensor, names, shapes, dtypes, sizes))
    most_materialized = max(most_materialized, stream.materialized - len(received))
exact = all(torch.equal(received[n], p.detach().to(torch.bfloat16)) for n, p in model.named_parameters())
print(json.dumps({"chunks": chunks, "params": len(received), "expected": len(meta), "exact": exact,
                  "ahead": most_materialized}))
"""


def test_vllm_packs_and_unpacks_the_stream_exactly() -> None:
    """vLLM 0.32's trainer engine accepts the stream (names, dtypes, shapes agree with metadata) and the
    packed buckets it would broadcast unpack, on the receiver's metadata-derived cuts, to the bf16 weights."""
    done = subprocess.run([str(VLLM_PYTHON), "-c", _VLLM_SIDE], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exact"] and result["params"] == result["expected"] == 5
    assert result["chunks"] >= 3
    assert result["ahead"] <= 1  # at most one parameter gathered beyond what was packed: no full state dict
