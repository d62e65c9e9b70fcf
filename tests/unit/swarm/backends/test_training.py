"""Policy updates use verl's functions exactly, micro-batching is exact, checkpoints round-trip."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend


def _samples(backend: TorchBackend, n: int = 6, seed: int = 0) -> list[TrainSample]:
    """Real roll-outs: some single-turn, some two-turn (context tokens with mask 0 in the middle)."""
    prompts = [backend.render_prompt([{"role": "user", "content": "q" * (3 + 5 * i)}], None) for i in range(n)]
    gens = backend.generate(prompts, [SamplingParams(max_tokens=6 + 3 * i, seed=seed + i) for i in range(n)])
    samples = []
    for i, (prompt, gen) in enumerate(zip(prompts, gens)):
        tokens, mask, logps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
        tokens += gen.token_ids
        mask += [1] * len(gen.token_ids)
        logps += gen.logprobs
        if i % 2:  # a second turn: user text (mask 0) then another completion (mask 1)
            follow = tokens + list(b"\nmore")
            second = backend.generate([follow], [SamplingParams(max_tokens=5, seed=100 + i)])[0]
            tokens = follow + second.token_ids
            mask += [0] * 5 + [1] * len(second.token_ids)
            logps += [0.0] * 5 + second.logprobs
        samples.append(TrainSample(tokens, mask, logps, advantage=float(i % 3) - 1.0, temperature=1.0))
    return samples


def _expected_logprobs(model, samples: list[TrainSample], pad_id: int, vocab: int):
    width = max(len(s.tokens) for s in samples)
    tokens = torch.full((len(samples), width), pad_id)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width))
    for i, s in enumerate(samples):
        tokens[i, : len(s.tokens)] = torch.tensor(s.tokens)
        attention[i, : len(s.tokens)] = 1
        mask[i, : len(s.tokens)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    logits = model(input_ids=tokens, attention_mask=attention).logits[:, :-1, :vocab]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp, mask[:, 1:]


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_train_step_matches_verl_on_the_same_tensors(backend: TorchBackend, loss_agg_mode: str) -> None:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig

    config = TrainConfig(lr=1e-3, loss_agg_mode=loss_agg_mode, grad_clip=0.5, rollout_is="off")  # verl's plain loss
    samples = _samples(backend)
    twin = copy.deepcopy(backend.model)
    twin.train()
    logp, response_mask = _expected_logprobs(twin, samples, backend.tokenizer.pad_token_id, backend.vocab_size)
    advantages = torch.tensor([s.advantage for s in samples]).unsqueeze(-1) * response_mask
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2, loss_agg_mode=loss_agg_mode)
    loss, verl_metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=logp.detach(), log_prob=logp, advantages=advantages, response_mask=response_mask,
        loss_agg_mode=loss_agg_mode, config=actor,
    )
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.0).step()

    metrics = backend.train_step(samples, config)

    assert metrics["train/loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert metrics["train/pg_loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert metrics["train/ppo_kl"] == pytest.approx(verl_metrics["actor/ppo_kl"], abs=1e-7)
    assert metrics["train/pg_clipfrac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-7)
    assert metrics["train/grad_norm"] == pytest.approx(float(grad_norm), rel=1e-4)
    assert metrics["train/rollout_logprob_diff"] < 1e-4  # recorded at sampling == recomputed now
    assert metrics["train/response_tokens"] == float(response_mask.sum())
    assert backend.policy_version == 1
    for ours, theirs in zip(backend.model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)  # Adam: ~lr * sign(g) for tiny g
    for key in ("train/entropy", "perf/train_tokens", "perf/train_s", "perf/tokens_per_s"):
        assert np.isfinite(metrics[key]) and metrics[key] > 0


def test_kl_penalty_uses_verl_against_the_frozen_reference(tiny_dir: Path) -> None:
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    config = TrainConfig(lr=1e-2, kl_coef=0.5, kl_penalty="low_var_kl")
    backend = TorchBackend.from_model(str(tiny_dir), config, seed=0)
    reference = copy.deepcopy(backend.model)
    samples = _samples(backend)
    first = backend.train_step(samples, config)
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before any update
    with torch.no_grad():
        logp, mask = _expected_logprobs(backend.model, samples, backend.tokenizer.pad_token_id, backend.vocab_size)
        ref_logp, _ = _expected_logprobs(reference, samples, backend.tokenizer.pad_token_id, backend.vocab_size)
    expected_kl = agg_loss(kl_penalty(logp, ref_logp, "low_var_kl"), mask, "token-mean")
    second = backend.train_step(samples, config)
    assert float(expected_kl) > 1e-6
    assert second["train/kl"] == pytest.approx(float(expected_kl), rel=1e-4)
    assert second["train/loss"] == pytest.approx(second["train/pg_loss"] + 0.5 * float(expected_kl), rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum"])
def test_micro_batches_give_the_same_update_as_one_batch(tiny_dir: Path, loss_agg_mode: str) -> None:
    whole = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    split = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    samples = _samples(whole)
    one = whole.train_step(samples, TrainConfig(loss_agg_mode=loss_agg_mode, micro_batch_tokens=8192))
    many = split.train_step(samples, TrainConfig(loss_agg_mode=loss_agg_mode, micro_batch_tokens=64))
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/rollout_logprob_diff"):
        assert many[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    # The accumulated (clipped) gradients are what must agree; Adam's first step is ~lr * sign(g),
    # so parameters are compared with a tolerance of a fraction of one update.
    for a, b in zip(whole.model.parameters(), split.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_ppo_epochs_clip_after_the_first_epoch(backend: TorchBackend) -> None:
    samples = _samples(backend)
    metrics = backend.train_step(samples, TrainConfig(lr=5e-2, ppo_epochs=3, clip_ratio=0.05))
    assert metrics["train/pg_clipfrac"] > 0  # later epochs move the ratio away from 1
    assert backend.policy_version == 1


def test_rollout_is_weights_stale_tokens_and_leaves_fresh_ones_alone(tiny_dir: Path) -> None:
    """Async samples come from an older policy: their tokens' loss is weighted by the truncated ratio
    pi_now / pi_rollout (verl's TIS). Fresh samples (rollout log-probs == now) get weight 1."""
    plain = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    fresh = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    stale = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    samples = _samples(plain)
    # The sampler was 4 nats less likely to pick these tokens than the policy is now: weight e^4, truncated to 2.
    older = [TrainSample(s.tokens, s.loss_mask, [lp - 4.0 if m else 0.0 for lp, m in zip(s.rollout_logprobs, s.loss_mask)],
                         advantage=s.advantage, temperature=s.temperature) for s in samples]
    unclipped = 1e9  # compare raw gradients
    base = plain.train_step(samples, TrainConfig(rollout_is="off", grad_clip=unclipped))
    same = fresh.train_step(samples, TrainConfig(rollout_is="token", grad_clip=unclipped))
    weighted = stale.train_step(older, TrainConfig(rollout_is="token", rollout_is_threshold=2.0, grad_clip=unclipped))
    assert "train/rollout_is_weight_mean" not in base
    assert same["train/rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert same["train/rollout_is_truncated"] == 0.0
    assert same["train/pg_loss"] == pytest.approx(base["train/pg_loss"], rel=1e-3, abs=1e-6)
    assert weighted["train/rollout_is_weight_mean"] == pytest.approx(2.0, abs=1e-6)
    assert weighted["train/rollout_is_truncated"] == 1.0
    assert weighted["train/pg_loss"] == pytest.approx(2.0 * base["train/pg_loss"], rel=1e-3, abs=1e-6)
    assert weighted["train/grad_norm"] == pytest.approx(2.0 * base["train/grad_norm"], rel=1e-3)
    for a, b in zip(plain.model.parameters(), stale.model.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, 2.0 * a.grad, atol=1e-6, rtol=1e-3)


def test_sequence_level_rollout_is_uses_the_whole_sequence_ratio(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    samples = _samples(backend)
    # 0.004 nats per generated token: sequences of 13+ tokens cross log(1.05), shorter ones do not.
    shifted = [TrainSample(s.tokens, s.loss_mask, [lp - 0.004 if m else 0.0 for lp, m in zip(s.rollout_logprobs, s.loss_mask)],
                           advantage=s.advantage, temperature=s.temperature) for s in samples]
    metrics = backend.train_step(shifted, TrainConfig(rollout_is="sequence", rollout_is_threshold=1.05))
    lengths = [sum(s.loss_mask) for s in samples]
    expected = sum(min(np.exp(0.004 * n), 1.05) * n for n in lengths) / sum(lengths)
    assert metrics["train/rollout_is_weight_mean"] == pytest.approx(expected, rel=2e-3)
    truncated = sum(n for n in lengths if 0.004 * n > np.log(1.05)) / sum(lengths)
    assert 0 < truncated < 1 and metrics["train/rollout_is_truncated"] == pytest.approx(truncated, abs=1e-6)


def test_advantages_equal_verl_grpo_on_hand_built_groups(backend: TorchBackend) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = [1.0, 0.0, 0.5, 0.25, 2.0, 2.0, -1.0, 3.0, 0.0]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c", "c"]
    for norm in (True, False):
        expected, _ = compute_grpo_outcome_advantage(
            token_level_rewards=torch.tensor(rewards).unsqueeze(-1), response_mask=torch.ones(len(rewards), 1),
            index=np.array(groups, dtype=object), norm_adv_by_std_in_grpo=norm,
        )
        ours = backend.advantages(rewards, groups, TrainConfig(norm_adv_by_std=norm))
        assert ours == pytest.approx(expected[:, 0].tolist(), abs=1e-6)
    assert ours[4] == ours[5] == 0.0  # identical rewards in a group carry no signal
    rloo = backend.advantages(rewards, groups, TrainConfig(adv_estimator="rloo"))
    assert rloo[0] == pytest.approx(1.0 - (0.0 + 0.5 + 0.25) / 3, abs=1e-6)


def test_advantages_reject_unknown_estimators_and_bad_input(backend: TorchBackend) -> None:
    with pytest.raises(ValueError, match="grpo"):
        backend.advantages([1.0], ["a"], TrainConfig(adv_estimator="nope"))
    with pytest.raises(ValueError):
        backend.advantages([1.0, 2.0], ["a"], TrainConfig())
    with pytest.raises(ValueError):
        backend.advantages([float("nan")], ["a"], TrainConfig())


def test_bad_batches_raise_and_change_nothing(backend: TorchBackend) -> None:
    before = [p.detach().clone() for p in backend.model.parameters()]
    good = _samples(backend, n=2)
    with pytest.raises(ValueError):
        backend.train_step([], TrainConfig())
    with pytest.raises(ValueError, match="unknown policy_loss"):
        backend.train_step(good, TrainConfig(policy_loss="not-a-loss"))
    with pytest.raises(ValueError):
        backend.train_step([TrainSample([1, 2, 3], [0, 0, 0], [0.0] * 3, advantage=1.0)], TrainConfig())
    with pytest.raises(ValueError):
        backend.train_step([TrainSample([1, 99_999], [0, 1], [0.0, 0.0], advantage=1.0)], TrainConfig())
    assert backend.policy_version == 0
    for a, b in zip(before, backend.model.parameters()):
        assert torch.equal(a, b)


def test_supervised_step_lowers_the_masked_nll(backend: TorchBackend) -> None:
    target = list(b"the answer is 42")
    prompt = backend.render_prompt([{"role": "user", "content": "question?"}], None)
    sample = TrainSample(prompt + target, [0] * len(prompt) + [1] * len(target), [0.0] * (len(prompt) + len(target)), 0.0)
    with torch.no_grad():
        logp, mask = _expected_logprobs(backend.model, [sample], backend.tokenizer.pad_token_id, backend.vocab_size)
    first = backend.supervised_step([sample], TrainConfig(lr=3e-3))
    assert first["sft/loss"] == pytest.approx(float(-(logp * mask).sum() / mask.sum()), rel=1e-5)
    for _ in range(15):
        last = backend.supervised_step([sample], TrainConfig(lr=3e-3))
    assert last["sft/loss"] < 0.7 * first["sft/loss"]
    assert backend.policy_version == 16


def test_save_load_round_trip_restores_outputs_optimizer_and_version(tiny_dir: Path, tmp_path: Path) -> None:
    config = TrainConfig(lr=1e-2)
    trained = TorchBackend.from_model(str(tiny_dir), config, seed=0)
    samples = _samples(trained)
    trained.train_step(samples, config)
    trained.train_step(samples, config)
    checkpoint = tmp_path / "ckpt"
    trained.save(str(checkpoint / "old"))  # a first save, then overwrite it atomically
    trained.save(str(checkpoint / "old"))
    assert sorted(p.name for p in checkpoint.iterdir()) == ["old"]

    restored = TorchBackend.from_model(str(tiny_dir), config, seed=0)
    restored.load(str(checkpoint / "old"))
    assert restored.policy_version == trained.policy_version == 2
    prompt = trained.render_prompt([{"role": "user", "content": "hi"}], None)
    params = [SamplingParams(max_tokens=16, seed=5)]
    expected = trained.generate([prompt], params)
    assert restored.generate([prompt], params) == expected
    # The checkpoint is itself a loadable model folder.
    assert TorchBackend.from_model(str(checkpoint / "old"), config, seed=0).generate([prompt], params) == expected
    # Optimizer state came back too: the next update is identical.
    trained.train_step(samples, config)
    restored.train_step(samples, config)
    for a, b in zip(trained.model.parameters(), restored.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_load_rejects_a_folder_that_is_not_a_checkpoint(backend: TorchBackend, tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="not a checkpoint"):
        backend.load(str(tiny_dir))
