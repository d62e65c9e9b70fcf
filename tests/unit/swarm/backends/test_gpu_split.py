"""GPUs split on purpose, checked without a GPU: a fake list of devices, and what each side is then given
(the vLLM child's command line and environment, verl's local Ray cluster and placement groups)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from swarm.devices import GpuSplit, split_gpus, visible_gpus

FOUR = ["0", "1", "2", "3"]


def test_default_split_gives_vllm_the_last_gpu_and_verl_the_rest() -> None:
    split = split_gpus(FOUR)
    assert split == GpuSplit(generator=("3",), trainer=("0", "1", "2"))
    assert split.disjoint and split.gpu_memory_utilization(None) == 0.9


@pytest.mark.parametrize(("generator", "trainer", "expected"), [
    ("0", None, (("0",), ("1", "2", "3"))),
    (None, "0,1", (("3",), ("0", "1"))),
    ("2,3", "0,1", (("2", "3"), ("0", "1"))),
])
def test_flags_reserve_disjoint_devices(generator, trainer, expected) -> None:
    split = split_gpus(FOUR, generator=generator, trainer=trainer)
    assert (split.generator, split.trainer) == expected
    assert split.disjoint and not set(split.generator) & set(split.trainer)


def test_ids_index_the_servers_visible_devices() -> None:
    visible = visible_gpus(4, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert visible == ["4", "5", "6", "7"]
    assert split_gpus(visible, generator="0") == GpuSplit(generator=("4",), trainer=("5", "6", "7"))
    assert visible_gpus(2, {}) == ["0", "1"]


def test_one_gpu_is_shared_on_purpose_and_bad_lists_are_refused() -> None:
    shared = split_gpus(["0"])
    assert shared == GpuSplit(generator=("0",), trainer=("0",))
    assert not shared.disjoint and shared.gpu_memory_utilization(None) == 0.4
    assert shared.gpu_memory_utilization(0.3) == 0.3
    assert split_gpus([]) == GpuSplit()  # no CUDA: nothing to split
    for bad in ({"generator": "4"}, {"trainer": "1,1"}, {"generator": "x"}, {"trainer": "0,1,2,3"}):
        with pytest.raises(ValueError):
            split_gpus(FOUR, **bad)
    # Without vLLM the trainer gets every GPU; the in-process torch trainer uses the first.
    assert split_gpus(FOUR, vllm=False) == GpuSplit(trainer=tuple(FOUR))
    assert split_gpus(FOUR, verl=False) == GpuSplit(generator=("3",), trainer=("0",))


def test_vllm_child_sees_only_its_gpus_with_cuda_graphs(tmp_path: Path) -> None:
    from swarm.backends.vllm.process import VllmProcess

    split = split_gpus(FOUR, generator="2,3")
    gpu = VllmProcess(tmp_path, tmp_path / "vllm.log", python=sys.executable, gpus=split.generator,
                      gpu_memory_utilization=split.gpu_memory_utilization(None))
    gpu.port = 1234
    argv = gpu.command()
    assert gpu.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "--enforce-eager" not in argv  # CUDA graphs on GPU
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    cpu = VllmProcess(tmp_path, tmp_path / "vllm.log", python=sys.executable)
    cpu.port = 1234
    argv = cpu.command()
    assert "--enforce-eager" in argv and argv[argv.index("--dtype") + 1] == "float32"
    assert "--gpu-memory-utilization" not in argv
    assert cpu.env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # left as it was


def test_verl_local_ray_declares_only_the_trainer_gpus() -> None:
    from swarm.backends.verl.ray_cluster import LocalRay, runtime_env

    split = split_gpus(FOUR, generator="3")
    ray = LocalRay(num_cpus=4, gpus=split.trainer)
    assert ray.num_gpus == 3 and ray.env_vars["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert "3" not in ray.env_vars["CUDA_VISIBLE_DEVICES"].split(",")
    attached = LocalRay(address="ray://head:10001", gpus=split.trainer)  # a cluster we join keeps its GPUs
    assert attached.num_gpus is None and "CUDA_VISIBLE_DEVICES" not in attached.env_vars
    shipped = runtime_env("ray://head:10001", {})
    assert shipped is not None and Path(shipped["py_modules"][0]).name == "swarm"  # code for remote nodes
    assert runtime_env(None, {}) is None


def test_eight_workers_on_two_four_gpu_nodes_get_two_placement_groups() -> None:
    from swarm.backends.verl.placement import plan_nodes, resource_pool

    plan = plan_nodes(8, [4.0, 4.0])
    assert plan == [4, 4]
    pool = resource_pool(plan, use_gpu=True)  # built, not started: no Ray needed
    assert pool.store == [4, 4] and pool.world_size == 8 and pool.max_colocate_count == 1
    assert plan_nodes(4, [4.0, 4.0]) == [4]  # fits one node: stays on one node
    assert plan_nodes(6, [2.0, 4.0, 0.0]) == [4, 2]
    assert plan_nodes(2, [1.9999999, 0.5]) == [2]  # Ray's float bookkeeping
    with pytest.raises(ValueError, match="8 verl workers"):
        plan_nodes(8, [4.0, 3.0])
