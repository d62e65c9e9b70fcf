"""Every verl internal the CPU platform and the verl trainer rely on, checked against the installed verl.

verl's upstream CI runs no actor or FSDP worker on CPU, so nothing upstream keeps these stable. If one
of these tests fails after a verl upgrade, re-read ``swarm/backends/verl/cpu_platform.py`` (and
``worker.py`` / ``trainer.py``) against the new version before moving the pin.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path


def _source(obj) -> str:
    return inspect.getsource(obj)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _field_names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def test_verl_is_the_pinned_version() -> None:
    import verl

    from swarm.backends.verl import cpu_platform

    assert verl.__version__ == cpu_platform.VERL_VERSION
    cpu_platform.check_verl_version()


def test_platform_registry_and_selection() -> None:
    from verl.plugin.platform import PlatformBase, PlatformRegistry, platform_manager, set_platform

    assert callable(PlatformRegistry.register) and callable(PlatformRegistry.get)
    assert hasattr(platform_manager, "_current_platform"), "activate() reads the platform singleton"
    assert _params(set_platform) == ["platform"]
    # VERL_PLATFORM picks a registered platform by name; unknown names raise (hence the registration).
    assert "VERL_PLATFORM" in _source(platform_manager._detect_platform_name)
    assert "PlatformRegistry.get(name)" in _source(platform_manager._create_platform)
    from swarm.backends.verl.cpu_platform import _platform_class

    platform = _platform_class()()  # TypeError here means PlatformBase grew an abstract method
    assert isinstance(platform, PlatformBase)
    assert (platform.device_name, platform.communication_backend_name(), platform.ray_resource_name()) == (
        "cpu", "gloo", "CPU")


def test_activate_makes_cpu_current_and_hides_trl() -> None:
    from verl.plugin.platform import get_platform
    from verl.utils import import_utils

    from swarm.backends.verl import cpu_platform

    cpu_platform.activate()
    cpu_platform.activate()  # idempotent
    assert get_platform().device_name == "cpu"
    from verl.utils.device import get_device_id, get_device_name, get_nccl_backend

    assert (get_device_name(), get_device_id(), get_nccl_backend()) == ("cpu", "cpu", "gloo")
    assert import_utils.is_trl_available() is False
    import importlib

    for name in cpu_platform._TRL_USERS:
        module = importlib.import_module(name)
        assert module.is_trl_available() is False, f"{name} still sees trl"


def test_device_module_covers_every_call_verl_makes() -> None:
    """Scan verl's source for ``get_torch_device().<name>`` and check our CPU device module has each."""
    import verl

    from swarm.backends.verl.cpu_platform import _device_module

    root = Path(verl.__file__).parent
    called = set()
    for path in root.rglob("*.py"):
        called |= set(re.findall(r"get_torch_device\(\)\.([A-Za-z_]+)", path.read_text(errors="ignore")))
    assert {"empty_cache", "max_memory_allocated", "synchronize"} <= called  # the scan found something
    missing = sorted(called - set(vars(_device_module())))
    assert not missing, f"verl now calls get_torch_device().{missing}: add them to cpu_platform._device_module"


def test_worker_env_reaches_verl_and_selects_the_fsdp_engine() -> None:
    import verl
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from swarm.backends.verl.cpu_platform import PLUGIN_MODULE, worker_env

    init_source = Path(verl.__file__).read_text()
    assert 'os.getenv("VERL_USE_EXTERNAL_MODULES"' in init_source and "import_external_libs(modules)" in init_source
    assert "VERL_ENGINE_DEVICE" in _source(EngineRegistry.get_engine_cls)
    assert EngineRegistry._engines["language_model"]["fsdp2"]["cuda"] is FSDPEngineWithLMHead
    env = worker_env()
    assert env["VERL_ENGINE_DEVICE"] == "cuda" and env["VERL_PLATFORM"] == "cpu"
    assert env["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE


def test_process_group_is_only_created_when_missing() -> None:
    """init_process_group() pre-empts verl's "cpu:gloo,cpu:gloo" string; that relies on this guard."""
    from verl.utils import distributed
    from verl.workers.engine_workers import TrainingWorker

    assert "initialize_global_process_group_ray(" in _source(TrainingWorker.__init__)
    assert "if not torch.distributed.is_initialized()" in _source(distributed.initialize_global_process_group_ray)


def test_configs_have_the_fields_the_trainer_sets() -> None:
    from verl.workers.config import (
        ActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.config.actor import PolicyLossConfig

    assert {"path", "load_tokenizer", "override_config", "enable_gradient_checkpointing",
            "use_remove_padding"} <= _field_names(HFModelConfig)
    assert 'override_config.get("attn_implementation"' in _source(HFModelConfig.__post_init__)
    assert {"strategy", "forward_only", "use_dynamic_bsz", "max_token_len_per_gpu", "infer_max_token_len_per_gpu",
            "mixed_precision", "use_torch_compile", "seed"} <= _field_names(FSDPEngineConfig)
    assert {"lr", "weight_decay", "clip_grad", "lr_scheduler_type"} <= _field_names(FSDPOptimizerConfig)
    assert {"model_type", "model_config", "engine_config", "optimizer_config",
            "checkpoint_config"} <= _field_names(TrainingWorkerConfig)
    assert {"strategy", "rollout_n", "ppo_micro_batch_size_per_gpu", "clip_ratio", "clip_ratio_low",
            "clip_ratio_high", "policy_loss", "loss_agg_mode", "loss_scale_factor", "ppo_epochs", "use_kl_loss",
            "kl_loss_coef", "kl_loss_type", "use_torch_compile"} <= _field_names(ActorConfig)
    assert "loss_mode" in _field_names(PolicyLossConfig)


def test_ray_worker_group_api() -> None:
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    assert {"process_on_nodes", "use_gpu", "max_colocate_count"} <= set(_params(RayResourcePool.__init__))
    assert "pgs" in _source(RayResourcePool.get_placement_groups)
    assert 'kwargs.get("worker_env"' in _source(RayWorkerGroup.__init__)
    assert {"cls"} <= set(_params(RayClassWithInitArgs.__init__))


def test_training_worker_and_engine_surface() -> None:
    from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.engine_workers import TrainingWorker

    assert callable(register) and Dispatch.ONE_TO_ALL and callable(make_nd_compute_dataproto_dispatch_fn)
    for name in ("reset", "set_loss_fn", "infer_batch", "train_batch"):
        assert callable(getattr(TrainingWorker, name)), name
    build = _source(FSDPEngine._build_model_optimizer)
    assert all(f"self.{a} = " in build for a in ("module", "optimizer", "lr_scheduler"))
    assert "self.optimizer_config.clip_grad" in _source(FSDPEngine.optimizer_step)
    assert 'data["loss_mask"].sum()' in _source(FSDPEngine.forward_backward_batch)
    # train_batch fills these only when the batch does not carry them (we pass a live token budget).
    assert "if key not in data.keys()" in _source(TrainingWorker.train_batch)
    prepare = _source(FSDPEngine.__subclasses__()[0].prepare_model_inputs)
    assert 'micro_batch["temperature"]' in prepare  # a per-row temperature tensor is honoured


def test_loss_and_padding_helpers() -> None:
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import Metric
    from verl.workers.utils import losses
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    assert _params(losses.ppo_loss) == ["config", "model_output", "data", "dp_group"]
    source = _source(losses.ppo_loss)
    for key in ("old_log_probs", "advantages", "rollout_is_weights", "ref_log_prob", "global_batch_size",
                "batch_num_tokens", "dp_size", "config.loss_scale_factor", 'policy_loss.get("loss_mode"'):
        assert key in source, key
    assert _params(left_right_2_no_padding) == ["data"]
    assert _params(no_padding_2_padding) == ["tensor", "data"]
    assert callable(tu.assign_non_tensor) and callable(tu.get)
    assert callable(Metric.aggregate_dp) and callable(Metric.aggregate)
