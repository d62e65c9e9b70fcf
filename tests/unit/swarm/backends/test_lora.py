"""LoRA on the torch trainer (``lora_rank`` > 0): generation reads the adapters merged (in fp32; factored
in a bf16 copy) and the recorded log-probs equal the trainer's recomputation through them within the
full fine-tuning bound, only the adapters train, published
weights are peft's ``merge_and_unload()`` weights, and a checkpoint resume restores the adapter and
its optimizer state. The verl trainer gets the same keys as verl's own LoRA settings."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from swarm.backends.base import SamplingParams, TrainConfig, TrainSample
from swarm.backends.torch import TorchBackend
from swarm.weights.lora import PEFT_PREFIX, merge_lora

LORA = TrainConfig(lr=1e-2, lora_rank=4, lora_alpha=8)


def _rollouts(backend: TorchBackend, step: int, n: int = 4) -> list[TrainSample]:
    """Fresh samples from the backend's current policy, with the log-probs it recorded."""
    prompts = [backend.render_prompt([{"role": "user", "content": "q" * (3 + 4 * i)}], None) for i in range(n)]
    gens = backend.generate(prompts, [SamplingParams(max_tokens=6 + 2 * i, seed=10 * step + i) for i in range(n)])
    return [TrainSample(list(p) + g.token_ids, [0] * len(p) + [1] * len(g.token_ids), [0.0] * len(p) + g.logprobs,
                        advantage=float(i % 2) - 0.5, temperature=1.0) for i, (p, g) in enumerate(zip(prompts, gens))]


def _adapters(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in backend.model.named_parameters() if ".lora_" in name}


@pytest.mark.parametrize("decode_cache", ["dynamic", "static"])  # the growing cache and the slot cache (a GPU's)
def test_generation_serves_the_trained_adapters_merged_and_training_agrees(tiny_dir: Path, decode_cache: str) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), LORA, seed=0, decode_cache=decode_cache)
    base = {name: p.detach().clone() for name, p in backend.model.named_parameters() if ".lora_" not in name}
    trained = {id(p) for p in backend.model.parameters() if p.requires_grad}  # only the adapters get optimizer state
    assert trained == {id(p) for p in backend._optimizer_for(LORA).param_groups[0]["params"]}
    assert len(trained) == len(_adapters(backend)) > 0
    prompt = backend.render_prompt([{"role": "user", "content": "hi"}], None)
    before = backend.generate([prompt], [SamplingParams(max_tokens=12, seed=3)])[0]
    for step in range(3):  # the same token-exact bound as the full fine-tuning test (test_training)
        metrics = backend.train_step(_rollouts(backend, step), LORA)
        assert metrics["train/rollout_logprob_diff"] < 1e-4, step
    assert backend.policy_version == 3
    for name, p in backend.model.named_parameters():  # the base is frozen; B moved off zero
        if ".lora_" not in name:
            assert torch.equal(p, base[name]), name
    assert any(float(p.detach().abs().max()) > 0 for name, p in backend.model.named_parameters() if ".lora_B." in name)
    after = backend.generate([prompt], [SamplingParams(max_tokens=12, seed=3)])[0]
    assert after.logprobs != before.logprobs  # generation reads the trained adapters
    # ... as plain merged weights (one matmul a layer), the very ones the backend publishes.
    served = backend.serving.state_dict()
    assert backend.serving is not backend.model and not any(".lora_" in name or "base_layer" in name for name in served)
    assert all(torch.equal(served[name], tensor) for name, tensor in backend.export_weights().items())


def test_bfloat16_serves_the_trained_adapters_and_leaves_the_base_copy_alone(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), LORA, seed=0, dtype="bfloat16")
    served_before = {n: p.clone() for n, p in backend.serving.named_parameters()}
    metrics = backend.train_step(_rollouts(backend, 0), LORA)
    assert all(v == v for v in metrics.values())  # no NaN under autocast
    master = dict(backend.model.named_parameters())
    for name, served in backend.serving.named_parameters():
        assert served.dtype == torch.bfloat16 and torch.equal(served, master[name].to(torch.bfloat16)), name
        if ".lora_B." in name:
            assert not torch.equal(served, served_before[name]), name  # the update reached the served copy


def test_published_weights_are_merge_and_unload_and_leave_the_model_alone(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    backend.train_step(_rollouts(backend, 0), LORA)
    live = {name: p.detach().clone() for name, p in backend.model.state_dict().items()}
    published = backend.export_weights()
    expected = copy.deepcopy(backend._peft).merge_and_unload().state_dict()
    assert set(published) == set(expected) and not any(".lora_" in name or "base_layer" in name for name in published)
    for name, tensor in expected.items():
        assert torch.equal(published[name], tensor), name
    assert all(torch.equal(backend.model.state_dict()[name], t) for name, t in live.items())  # unchanged
    version = backend.policy_version
    backend.load_weights(version + 5, published)  # its own export: only the version moves
    assert backend.policy_version == version + 5
    assert all(torch.equal(backend.model.state_dict()[name], t) for name, t in live.items())


def test_a_plain_generator_serves_the_published_policy(tiny_dir: Path) -> None:
    """``--engine vllm`` and pool workers load the merged weights into a plain model: same policy."""
    trainer = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    trainer.train_step(_rollouts(trainer, 0), LORA)
    plain = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    plain.load_weights(1, trainer.export_weights())
    other = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)  # a LoRA backend that only generates
    other.load_weights(1, trainer.export_weights())
    prompt = trainer.render_prompt([{"role": "user", "content": "hello"}], None)
    params = [SamplingParams(max_tokens=16, seed=7)]
    expected = trainer.generate([prompt], params)[0]
    for served in (plain.generate([prompt], params)[0], other.generate([prompt], params)[0]):
        assert served.token_ids == expected.token_ids
        assert max(abs(a - b) for a, b in zip(served.logprobs, expected.logprobs)) < 1e-4


def test_checkpoint_resume_restores_the_adapter_and_its_optimizer(tiny_dir: Path, tmp_path: Path) -> None:
    trained = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    for step in range(2):
        trained.train_step(_rollouts(trained, step), LORA)
    trained.save(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").is_file()

    restored = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    restored.load(str(tmp_path / "ckpt"))
    assert restored.policy_version == 2
    ours, theirs = _adapters(trained), _adapters(restored)
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    prompt = trained.render_prompt([{"role": "user", "content": "hi"}], None)
    params = [SamplingParams(max_tokens=16, seed=5)]
    expected = trained.generate([prompt], params)
    assert restored.generate([prompt], params) == expected
    # The checkpoint's model folder is the merged policy, loadable as a plain model (W + s·BA is rounded
    # once where the adapted model adds the two products: equal up to float rounding).
    plain = TorchBackend.from_model(str(tmp_path / "ckpt"), TrainConfig(), seed=0).generate([prompt], params)[0]
    assert plain.token_ids == expected[0].token_ids
    assert max(abs(a - b) for a, b in zip(plain.logprobs, expected[0].logprobs)) < 1e-4
    # The adapters' optimizer state came back too: the next update is identical.
    samples = _rollouts(trained, 5)
    trained.train_step(samples, LORA)
    restored.train_step(samples, LORA)
    ours, theirs = _adapters(trained), _adapters(restored)
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-6, rtol=1e-5) for k in ours)


def test_a_resume_with_other_lora_settings_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    trained = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    trained.train_step(_rollouts(trained, 0), LORA)
    trained.save(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="holds a LoRA adapter"):
        TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0).load(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="does not fit"):
        TorchBackend.from_model(str(tiny_dir), LORA.model_copy(update={"lora_rank": 8}), seed=0).load(
            str(tmp_path / "lora"))
    TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0).save(str(tmp_path / "full"))
    with pytest.raises(ValueError, match="holds no LoRA adapter"):
        TorchBackend.from_model(str(tiny_dir), LORA, seed=0).load(str(tmp_path / "full"))


def test_lora_keys_are_validated_and_fixed_for_the_model_life(tiny_dir: Path) -> None:
    backend = TorchBackend.from_model(str(tiny_dir), LORA, seed=0)
    backend.check_config(LORA.model_copy(update={"lr": 1e-3}))  # other keys stay live
    with pytest.raises(ValueError, match="fixed when the model loads"):
        backend.check_config(LORA.model_copy(update={"lora_alpha": 32}))
    with pytest.raises(ValueError, match="lora_target_modules"):
        TrainConfig(lora_rank=4, lora_target_modules=[])
    with pytest.raises(ValueError, match="lora_target_modules"):
        TorchBackend.from_model(str(tiny_dir), TrainConfig(lora_rank=4, lora_target_modules=["no_such_proj"]), seed=0)
    narrow = TorchBackend.from_model(str(tiny_dir), TrainConfig(lora_rank=2, lora_target_modules=["q_proj", "v_proj"]))
    assert {name.split(".")[-4] for name, p in narrow.model.named_parameters() if p.requires_grad} == {"q_proj", "v_proj"}


def test_merge_lora_reads_peft_names_and_refuses_what_it_cannot_merge() -> None:
    w, a, b = torch.randn(3, 5), torch.randn(2, 5), torch.randn(3, 2)
    state = {PEFT_PREFIX + "l.base_layer.weight": w, PEFT_PREFIX + "l.base_layer.bias": torch.ones(3),
             PEFT_PREFIX + "l.lora_A.default.weight": a, PEFT_PREFIX + "l.lora_B.default.weight": b,
             PEFT_PREFIX + "norm.weight": torch.ones(5)}
    merged = merge_lora(state, 0.5)
    assert set(merged) == {"l.weight", "l.bias", "norm.weight"}
    assert torch.allclose(merged["l.weight"], w + 0.5 * b @ a)
    assert merged["norm.weight"] is state[PEFT_PREFIX + "norm.weight"]
    with pytest.raises(ValueError, match="without adapter"):
        merge_lora({"l.base_layer.weight": w}, 1.0)
    with pytest.raises(ValueError, match="only linear-layer"):
        merge_lora({"e.lora_embedding_A.default": a}, 1.0)


def test_the_verl_trainer_gets_the_same_keys_as_verls_lora_settings(tiny_dir: Path) -> None:
    from swarm.backends.verl import knobs

    config = TrainConfig(lora_rank=8, lora_alpha=32, lora_target_modules=["q_proj", "v_proj"])
    knobs.check_supported(config)  # honoured, not refused as an unknown knob
    assert knobs.lora_settings(config) == {"lora_rank": 8, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}
    model = knobs.worker_config(tiny_dir, config, device="cpu").model_config
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (8, 32, ["q_proj", "v_proj"])
    off = knobs.worker_config(tiny_dir, TrainConfig(), device="cpu").model_config
    assert (off.lora_rank, off.target_modules) == (0, "all-linear")  # verl's own "off" and default targets
