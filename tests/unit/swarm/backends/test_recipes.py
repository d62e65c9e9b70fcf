"""Named recipes (``swarm.backends.recipes``): ``recipe = "dr_grpo"`` is Dr. GRPO in one word, filled
in and checked once wherever a config is validated (a model, a config file, a live patch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.backends.base import TrainConfig
from swarm.config import ServerConfig

DR_GRPO = {"norm_adv_by_std": False, "loss_agg_mode": "seq-mean-token-sum-norm"}


def _keys(config: TrainConfig) -> dict[str, object]:
    return {key: getattr(config, key) for key in DR_GRPO}


def test_dr_grpo_sets_its_two_keys_and_refuses_a_contradiction() -> None:
    assert _keys(TrainConfig(recipe="dr_grpo")) == DR_GRPO
    assert _keys(TrainConfig(recipe="dr_grpo", **DR_GRPO)) == DR_GRPO  # spelled out as well: the same
    assert TrainConfig().recipe == "none" and _keys(TrainConfig()) == {"norm_adv_by_std": True,
                                                                      "loss_agg_mode": "token-mean"}
    with pytest.raises(ValueError, match=r"recipe 'dr_grpo' sets norm_adv_by_std=False, not True; set recipe='none'"):
        TrainConfig(recipe="dr_grpo", norm_adv_by_std=True)
    with pytest.raises(ValueError, match="recipe"):
        TrainConfig(recipe="dapo")


def test_a_live_patch_turns_the_recipe_on_and_off() -> None:
    on = ServerConfig().patched({"recipe": "dr_grpo"})
    assert on.recipe == "dr_grpo" and _keys(on) == DR_GRPO
    with pytest.raises(ValueError, match="recipe 'dr_grpo' sets loss_agg_mode"):
        on.patched({"loss_agg_mode": "token-mean"})  # half of Dr. GRPO is not Dr. GRPO
    off = on.patched({"recipe": "none", "loss_agg_mode": "token-mean"})
    assert (off.recipe, off.loss_agg_mode, off.norm_adv_by_std) == ("none", "token-mean", False)
    assert ServerConfig.model_validate(on.model_dump()) == on  # a stored config (checkpoint, buffer) reloads


def test_a_config_file_says_it_in_one_word(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[loss]\nrecipe = "dr_grpo"\nclip_ratio_high = 0.28\n')
    config = ServerConfig.from_toml(path)
    assert _keys(config) == DR_GRPO and config.clip_range() == (0.2, 0.28)
    path.write_text('[loss]\nrecipe = "dr_grpo"\nnorm_adv_by_std = true\n')
    with pytest.raises(ValueError, match="norm_adv_by_std"):
        ServerConfig.from_toml(path)


def test_the_verl_trainer_honours_the_recipe() -> None:
    from swarm.backends.verl import knobs

    config = TrainConfig(recipe="dr_grpo")
    knobs.check_supported(config)
    assert knobs.actor_config(config, 7).loss_agg_mode == "seq-mean-token-sum-norm"
    assert knobs.loss_scale(config, 7) == 7
