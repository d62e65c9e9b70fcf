"""The verl trainer for real: Ray on loopback, verl FSDP2 ``TrainingWorker``s over gloo, the tiny model.

One Ray cluster and two trainers (1 worker, 2 sharded workers) are shared by the module, so the
file stays around two minutes on two busy cores. The SIGKILL test starts its own Ray in a child
process, kills that process and checks that none of its Ray processes is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import wait_for

from swarm.backends.base import TrainConfig, TrainSample
from swarm.mismatch import SOURCE_DIFF_PREFIX

# Non-trivial on purpose: with one on-policy epoch the vanilla loss is just -mean(advantage), so the
# second epoch (clipping, a moved policy), the KL term and the importance weights are what compare.
CONFIG = TrainConfig(lr=3e-3, ppo_epochs=2, clip_ratio=0.1, kl_coef=0.05, rollout_is="token",
                     rollout_is_threshold=1.5, micro_batch_tokens=64)


def _samples(seed: int = 1) -> list[TrainSample]:
    """Five merged-looking timelines: uneven lengths, a masked tool token, one row at temperature 0.7,
    sampled by two pool members (and one row by no known member)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(5):
        prompt = torch.randint(0, 256, (6 + i,), generator=g).tolist()
        response = torch.randint(0, 256, (10 + 2 * i,), generator=g).tolist()
        mask = [0] * len(prompt) + [1] * len(response)
        if i == 2:
            mask[len(prompt) + 3] = 0  # a tool/user token inside the response
        logprobs = [0.0] * len(prompt) + (-torch.rand(len(response), generator=g) * 3 - 4).tolist()
        out.append(TrainSample(tokens=prompt + response, loss_mask=mask, rollout_logprobs=logprobs,
                               advantage=(i - 2) / 2, temperature=0.7 if i == 3 else 1.0,
                               source=("w-a", "w-a", "", "w-a", "w-b")[i]))
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    """One loopback Ray for the module's trainers (they reuse it and leave it running)."""
    from swarm.backends.verl.ray_cluster import LocalRay

    cluster = LocalRay(num_cpus=3)
    cluster.start()
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def verl1(ray_cluster, tiny_dir: Path):
    from swarm.backends.verl import VerlTrainer

    with VerlTrainer(str(tiny_dir), CONFIG, workers=1) as trainer:
        yield trainer


@pytest.fixture(scope="module")
def verl2(ray_cluster, tiny_dir: Path):
    from swarm.backends.verl import VerlTrainer

    with VerlTrainer(str(tiny_dir), CONFIG, workers=2) as trainer:
        yield trainer


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def _torch_logprobs(backend, samples: list[TrainSample]) -> torch.Tensor:
    from swarm.backends.torch import training

    batch = training.pack(samples, 0, backend.vocab_size, backend.max_context)
    with torch.no_grad():
        logp, _ = training.sequence_logprobs(backend.model, batch, backend.vocab_size)
    return logp * batch.mask


def test_one_and_two_workers_and_torch_take_the_same_step(verl1, verl2, tiny_dir: Path) -> None:
    from swarm.backends.torch import TorchBackend

    samples = _samples()
    one = verl1.train_step(samples, CONFIG)
    two = verl2.train_step(samples, CONFIG)
    reference = TorchBackend.from_model(str(tiny_dir), CONFIG, seed=0)
    plain = reference.train_step(samples, CONFIG)
    print(f"\nverl1 loss={one['train/loss']:.9g} grad={one['train/grad_norm']:.9g} step={one['perf/train_s']:.3f}s"
          f"\nverl2 loss={two['train/loss']:.9g} grad={two['train/grad_norm']:.9g} step={two['perf/train_s']:.3f}s"
          f"\ntorch loss={plain['train/loss']:.9g} grad={plain['train/grad_norm']:.9g}")
    for key in ("train/loss", "train/grad_norm", "train/pg_loss"):
        assert _rel(one[key], two[key]) < 1e-5, (key, one[key], two[key])
    assert abs(one["train/loss"] - plain["train/loss"]) < 1e-4 * max(1.0, abs(plain["train/loss"]))
    assert _rel(one["train/grad_norm"], plain["train/grad_norm"]) < 1e-4
    for key in ("train/entropy", "train/rollout_logprob_diff", "train/kl", "train/rollout_is_weight_mean",
                "train/response_tokens", "train/samples"):
        assert abs(one[key] - plain[key]) < 1e-4, (key, one[key], plain[key])
    assert one["rollout/logprob_diff_max"] >= one["rollout/logprob_diff_mean"] > 0
    # The per-member mismatch the server drains a worker by: the same keys and values as torch's.
    members = {k for k in plain if k.startswith(SOURCE_DIFF_PREFIX)}
    assert members == {SOURCE_DIFF_PREFIX + "w-a", SOURCE_DIFF_PREFIX + "w-b"}
    assert members == {k for k in one if k.startswith(SOURCE_DIFF_PREFIX)}
    for key in members:
        assert abs(one[key] - plain[key]) < 1e-4 and abs(two[key] - plain[key]) < 1e-4, (key, one[key], plain[key])
    assert max(one[k] for k in members) <= one["rollout/logprob_diff_max"] + 1e-6
    assert verl1.policy_version == verl2.policy_version == 1

    # The updated weights: identical between 1 and 2 workers, and the same policy as the torch step.
    w1, w2 = verl1.export_weights(), verl2.export_weights()
    assert set(w1) == set(w2) == set(reference.model.state_dict())
    # Adam divides by sqrt(v): float-rounding noise on near-zero gradients moves a weight by up to a
    # small fraction of lr (3e-3 here), so weights agree to 1e-4 while losses agree to 1e-6.
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    print(f"max |w1 - w2| after the step: {worst:.3g}")
    assert worst < 1e-4, worst
    assert all(v.device.type == "cpu" for v in w1.values())
    loaded = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    loaded.model.load_state_dict(w2)
    diff = (_torch_logprobs(loaded, samples) - _torch_logprobs(reference, samples)).abs().max()
    print(f"max |log-prob| difference, verl-2-worker weights vs the torch step: {float(diff):.3g}")
    assert float(diff) < 1e-3, float(diff)


def test_supervised_step_matches_torch(verl1, tiny_dir: Path) -> None:
    from swarm.backends.base import Trainer
    from swarm.backends.torch import TorchBackend

    assert isinstance(verl1, Trainer)
    samples = _samples(seed=2)
    twin = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    twin.model.load_state_dict(verl1.export_weights())  # the same weights, whatever ran before
    version = verl1.policy_version
    ours, theirs = verl1.supervised_step(samples, CONFIG), twin.supervised_step(samples, CONFIG)
    assert _rel(ours["sft/loss"], theirs["sft/loss"]) < 1e-5
    assert _rel(ours["sft/grad_norm"], theirs["sft/grad_norm"]) < 1e-4
    assert ours["sft/tokens"] == theirs["sft/tokens"]
    assert verl1.policy_version == version + 1


def test_checkpoint_restores_weights_and_version_across_worker_counts(verl1, verl2, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    verl2.train_step(_samples(seed=3), CONFIG)
    folder = tmp_path / "ckpt"
    verl2.save(str(folder))
    assert {"model.safetensors", "optimizer.pt", "reference.safetensors", "trainer_state.json", "config.json",
            "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    hf = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    saved = verl2.export_weights()
    assert all(torch.equal(hf.state_dict()[k], saved[k]) for k in saved)

    verl1.load(str(folder))  # another trainer, with another worker count
    assert verl1.policy_version == verl2.policy_version
    restored = verl1.export_weights()
    assert all(torch.equal(restored[k], saved[k]) for k in saved)
    # Same weights, optimizer moments and reference: the next step is the same on both.
    samples = _samples(seed=4)
    a, b = verl1.train_step(samples, CONFIG), verl2.train_step(samples, CONFIG)
    for key in ("train/loss", "train/grad_norm", "train/kl"):
        assert _rel(a[key], b[key]) < 1e-5, (key, a[key], b[key])
    assert b["train/kl"] > 0  # the reference came back too: the policy has moved away from it


def test_letters_policy_learns_on_two_workers_and_publishes_exact_weights(verl2, tiny_dir: Path) -> None:
    """GRPO on the letters task: the torch generator samples, verl (2 FSDP2 workers) trains, and the
    weights go back to the generator after every step, as the engine's step loop publishes them."""
    import random

    from swarm.backends.base import SamplingParams
    from swarm.backends.torch import TorchBackend

    config = TrainConfig(lr=1e-3)
    generator = TorchBackend.from_model(str(tiny_dir), config, seed=0)
    generator.model.load_state_dict(verl2.export_weights())
    rng = random.Random(0)
    rewards_per_step, worst_mismatch = [], 0.0
    for _ in range(40):
        prompts = [[rng.randrange(ord("a"), ord("z") + 1) for _ in range(8)] for _ in range(4)]
        rows = [p for p in prompts for _ in range(8)]
        generations = generator.generate(rows, [SamplingParams(max_tokens=16)] * len(rows))
        rewards = [sum(t == ord("a") for t in g.token_ids) / 16 for g in generations]
        advantages = verl2.advantages(rewards, [str(i // 8) for i in range(len(rows))], config)
        samples = [TrainSample(tokens=r + g.token_ids, loss_mask=[0] * len(r) + [1] * len(g.token_ids),
                               rollout_logprobs=[0.0] * len(r) + list(g.logprobs), advantage=a)
                   for r, g, a in zip(rows, generations, advantages, strict=True) if g.token_ids]
        metrics = verl2.train_step(samples, config)
        generator.model.load_state_dict(verl2.export_weights())
        rewards_per_step.append(sum(rewards) / len(rewards))
        worst_mismatch = max(worst_mismatch, metrics["rollout/logprob_diff_max"])
    first, last = sum(rewards_per_step[:5]) / 5, sum(rewards_per_step[-5:]) / 5
    print(f"\nletters reward {first:.3f} -> {last:.3f}; worst generator/trainer log-prob gap {worst_mismatch:.2e}")
    assert last > max(0.25, 5 * first), rewards_per_step
    assert worst_mismatch < 1e-3  # the trainer scores exactly the policy that sampled


def test_unsupported_knobs_are_named() -> None:
    from swarm.backends.verl import check_supported

    check_supported(CONFIG)
    with pytest.raises(ValueError, match="kl_penalty"):
        check_supported(TrainConfig(kl_penalty="full"))
    with pytest.raises(ValueError, match="policy_loss"):
        check_supported(TrainConfig(policy_loss="no-such-loss"))
    with pytest.raises(ValueError, match="adv_estimator"):
        check_supported(TrainConfig(adv_estimator="gae"))

    class Wider(TrainConfig):  # a knob added to TrainConfig later, not yet mapped to verl
        entropy_coef: float = 0.0

    check_supported(Wider())  # at its default it changes nothing
    with pytest.raises(ValueError, match=r"TrainConfig\.entropy_coef is not supported by the verl trainer"):
        check_supported(Wider(entropy_coef=0.01))


_CHILD = """
import os, sys, time
from swarm.backends.base import TrainConfig
from swarm.backends.verl import VerlTrainer
trainer = VerlTrainer(sys.argv[1], TrainConfig(), workers=1)
print("READY", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_no_ray_process_outlives_a_sigkilled_server(tiny_dir: Path, tmp_path: Path) -> None:
    import psutil

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true",
           "RAY_AUTH_MODE": "disabled"}
    ray_procs: list[psutil.Process] = []
    stderr = tmp_path / "child.err"
    with stderr.open("w") as err:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tiny_dir)], stdout=subprocess.PIPE,
                                 stderr=err, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        line = ""
        while time.monotonic() < deadline and "READY" not in line:
            line = child.stdout.readline()
            if not line and child.poll() is not None:
                tail = "\n".join(stderr.read_text(errors="replace").splitlines()[-40:])
                pytest.fail(f"the child trainer exited with {child.returncode} before it was ready; its stderr "
                            f"ended:\n{tail}")
        assert "READY" in line
        ray_procs = psutil.Process(child.pid).children(recursive=True)
        names = {p.name() for p in ray_procs}
        assert {"raylet", "gcs_server"} <= names, names
        assert any("SwarmTrainingWorker" in " ".join(p.cmdline()) or p.name().startswith("ray::") for p in ray_procs)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        wait_for(lambda: not any(_alive(p.pid) for p in ray_procs), 30, interval=0.5,
                 what=lambda: "the Ray processes to end with the killed server (survivors: "
                              f"{[(p.pid, p.name()) for p in ray_procs if _alive(p.pid)]})")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for p in ray_procs:  # do not leave a failed run's processes to the other engineers
            if _alive(p.pid):
                p.kill()
