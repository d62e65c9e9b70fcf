"""The verl adapter's conversion, checked against verl's own DataProto and config schema on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm.backends.base import TrainConfig, TrainSample
from swarm.server.records.timeline import EpisodeTrace


def _merged_sample() -> TrainSample:
    trace = EpisodeTrace(merge=True)
    trace.record([5, 6, 7], [([20, 21], [-0.1, -0.2])], version=3, temperature=1.0)
    trace.record([5, 6, 7, 20, 21, 8, 9], [([22], [-0.3])], version=4, temperature=1.0)
    (sample,) = trace.samples(advantage=0.75)
    return sample


def test_merged_episode_becomes_agent_loop_layout() -> None:
    from swarm.backends.verl import samples_to_data_proto

    short = TrainSample(tokens=[1, 30], loss_mask=[0, 1], rollout_logprobs=[0.0, -0.5], advantage=-1.0)
    data = samples_to_data_proto([_merged_sample(), short], rewards=[1.0, 0.0], group_ids=["g", "g"], pad_token_id=0)
    b = data.batch
    assert b["prompts"].tolist() == [[5, 6, 7], [0, 0, 1]]
    assert b["responses"].tolist() == [[20, 21, 8, 9, 22], [30, 0, 0, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert torch.allclose(b["rollout_log_probs"][0], torch.tensor([-0.1, -0.2, 0.0, 0.0, -0.3]))
    assert b["rm_scores"][0].tolist() == [0, 0, 0, 0, 1.0] and b["rm_scores"][1, 0] == 0.0
    assert b["advantages"][0].tolist() == [0.75, 0.75, 0.0, 0.0, 0.75]
    assert b["attention_mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0, 0]
    assert b["position_ids"][1, 2:4].tolist() == [0, 1]
    assert list(data.non_tensor_batch["uid"]) == ["g", "g"]


def test_sample_without_generated_tokens_is_refused() -> None:
    from swarm.backends.verl import samples_to_data_proto

    empty = TrainSample(tokens=[1, 2], loss_mask=[0, 0], rollout_logprobs=[0.0, 0.0], advantage=0.0)
    with pytest.raises(ValueError, match="without generated tokens"):
        samples_to_data_proto([empty], rewards=[0.0], group_ids=["g"], pad_token_id=0)


def test_overrides_name_real_keys_of_verls_trainer_config() -> None:
    """Every override path must exist in verl's generated PPO trainer config."""
    import verl
    import yaml

    from swarm.backends.verl import verl_overrides

    cfg_file = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    tree = yaml.safe_load(cfg_file.read_text())
    overrides = verl_overrides(TrainConfig(lr=3e-6, kl_coef=0.01, rollout_is="off"), "/models/qwen", n_gpus=8)
    for item in overrides:
        path, _, _value = item.partition("=")
        node = tree
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, f"{path} is not a verl config key"
            node = node[part]
    assert "actor_rollout_ref.actor.use_kl_loss=True" in overrides
    assert "algorithm.rollout_correction.rollout_is=null" in overrides  # off: no correction
    token = verl_overrides(TrainConfig(rollout_is="token", rollout_is_threshold=3.0), "/models/qwen")
    assert {"algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=3.0"} <= set(token)
