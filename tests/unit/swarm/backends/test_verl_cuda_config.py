"""verl on CUDA, resolved without a GPU: the worker configuration a ``cuda`` trainer builds, and a fresh
process set up as a GPU Ray worker is (``compat.worker_env("cuda")``) building the model through
verl's monkey patch, which imports a class trl 1.x removed unless verl sees trl as unavailable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from swarm.backends.base import TrainConfig

ROOT = Path(__file__).resolve().parents[4]


def test_cuda_worker_config_is_sdpa_and_bf16(tiny_dir: Path) -> None:
    from swarm.backends.verl import compat, knobs

    compat.prepare("cuda")  # the driver's side on GPU: trl hidden, verl's own (CUDA) platform kept
    config = knobs.worker_config(tiny_dir, TrainConfig(), device="cuda", seed=0)
    assert config.model_config.override_config["attn_implementation"] == "sdpa"  # flash_attn is not installed
    assert config.model_config.hf_config._attn_implementation == "sdpa"  # what verl resolved from it
    assert config.engine_config.mixed_precision == {"param_dtype": "bf16", "reduce_dtype": "fp32",
                                                    "buffer_dtype": "fp32"}
    assert config.engine_config.strategy == "fsdp2"
    cpu = knobs.worker_config(tiny_dir, TrainConfig(), device="cpu", seed=0)  # the CPU path as before
    assert cpu.engine_config.mixed_precision["param_dtype"] == "fp32"
    assert cpu.model_config.override_config == {"attn_implementation": "sdpa"}


_GPU_WORKER = """
import json, sys
import verl  # imports the plugin named in VERL_USE_EXTERNAL_MODULES first, as in a Ray worker
from transformers import AutoConfig, AutoModelForCausalLM
from verl.models.transformers.monkey_patch import apply_monkey_patch
from verl.utils.import_utils import is_trl_available
from swarm.backends.verl import compat

attn = compat.model_overrides("cuda")["attn_implementation"]
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]), attn_implementation=attn)
apply_monkey_patch(model)  # verl's model patching: the trl import is here
print(json.dumps({"trl": is_trl_available(), "attn": model.config._attn_implementation}))
"""


def test_a_gpu_worker_builds_the_model_without_trl_errors(tiny_dir: Path) -> None:
    import trl  # the version whose removed class verl's patch imports

    from swarm.backends.verl import compat

    assert not hasattr(trl, "AutoModelForCausalLMWithValueHead")
    env = {**os.environ, **compat.worker_env("cuda"), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    assert env["VERL_USE_EXTERNAL_MODULES"] == compat.TRL_PLUGIN
    done = subprocess.run([sys.executable, "-c", _GPU_WORKER, str(tiny_dir)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"trl": False, "attn": "sdpa"}
