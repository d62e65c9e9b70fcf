"""``VerlTrainer``: the ``Trainer`` role on verl's own worker API, on a Ray group of FSDP2 workers.

The driver (the swarm server) keeps no model. It starts Ray (or connects with ``ray_address``),
creates N verl ``TrainingWorker``s (``SwarmTrainingWorker``, FSDP2) on a ``RayResourcePool``, and for
each step sends them the server's samples as verl ``DataProto`` → padding-free ``TensorDict``
batches, the way verl's own ``RayPPOTrainer`` does:

1. ``infer_batch``: the current policy's log-probs and entropy of the sampled tokens (the PPO
   "old" log-probs; compared with the rollout's recorded log-probs for the mismatch metrics);
2. optionally the reference log-probs (KL) and verl's rollout importance weights;
3. ``train_batch`` once per PPO epoch with verl's ``ppo_loss`` and an ``ActorConfig`` built from
   ``TrainConfig`` (the policy loss is picked by name from verl's registry).

Advantages come from the same verl estimators as the torch trainer
(``swarm.algorithms.compute_advantages``). Every normaliser is the global batch's,
so 1 and N workers, and this trainer and the torch trainer, compute the same loss.

Checkpoints (``save``/``load``) are full, worker-count-independent folders; their layout is
documented in ``swarm.backends.verl.checkpoint``. ``close()`` ends the workers and the local Ray
cluster (``ray_cluster`` explains how Ray dies with a killed server).

Not thread-safe by design: the server calls every method from one thread, one at a time.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import torch

from swarm.backends.base import TrainConfig, Trainer, TrainSample, Weights
from swarm.backends.verl import batch as batching
from swarm.backends.verl import knobs
from swarm.backends.verl.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from swarm.backends.verl.knobs import actor_config, check_supported, loss_scale, optimizer_settings
from swarm.backends.verl.ray_cluster import LocalRay
from swarm.mismatch import SOURCE_DIFF_PREFIX, worst_by_source
from swarm.weights.verl_sender import VerlNcclSender

if TYPE_CHECKING:
    from verl import DataProto  # read as Any: verl is not type-checked through

logger = logging.getLogger(__name__)

__all__ = ["VerlTrainer"]


def _vocab_and_pad(folder: Path, embedding_rows: int) -> tuple[int, int]:
    """Ids the tokenizer knows (logits past them are never sampled or trained) and the pad id."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (folder / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return min(len(tokenizer), embedding_rows), int(pad if pad is not None else 0)


class VerlTrainer(Trainer):
    """The ``Trainer`` protocol (see ``swarm.backends.base``) on a verl FSDP2 worker group.

    ``model``: "tiny" or a local Hugging Face causal-LM folder. ``workers``: FSDP2 ranks (one Ray
    actor each, one CPU or one GPU). ``ray_address``: join that cluster instead of starting a local
    one. ``device``: "cpu" (gloo, the project's CPU platform, fp32, SDPA) or "cuda" (NCCL, bf16 compute
    parameters, SDPA unless flash-attn imports: ``compat``; not run on this project's CPU machines);
    default "cuda" when torch sees a GPU. ``num_cpus``: CPUs a local cluster declares (default:
    ``workers``). ``gpus``: physical GPU ids a local cluster may give the workers (the rest, e.g. the
    vLLM generator's, stay out of Ray); workers are placed one placement group per node
    (``placement``).
    """

    def __init__(self, model: str, config: TrainConfig, *, workers: int = 1, ray_address: str | None = None,
                 device: str | None = None, seed: int = 0, num_cpus: int | None = None,
                 gpus: Sequence[str] | None = None) -> None:
        from swarm.models.resolve import model_name, resolve_model_folder

        check_supported(config)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.folder = resolve_model_folder(model, seed=seed)
        self.model_name = model_name(model, self.folder)
        self.workers = workers
        self.policy_version = 0
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._cpu = self.device == "cpu"
        hf_config = json.loads((self.folder / "config.json").read_text())
        self._tied = bool(hf_config.get("tie_word_embeddings", False))
        self.max_context = int(hf_config.get("max_position_embeddings", 2048))
        self.vocab_size, self._pad_id = _vocab_and_pad(self.folder, int(hf_config["vocab_size"]))
        self._optimizer = optimizer_settings(config)
        self._lora = knobs.lora_settings(config)  # the workers' model is built with it, once
        # A local cluster declares as many CPUs as workers need (each CPU worker takes one bundle).
        self._ray = LocalRay(address=ray_address, num_cpus=num_cpus or (workers if self._cpu else None),
                             gpus=None if self._cpu or gpus is None else tuple(gpus))
        self._group: Any = None
        self._pool: Any = None
        self._has_reference = False
        self._loss_key: tuple[str, ...] | tuple[str, str, int | None] = ()  # the loss the workers hold
        try:
            self._start(config, seed)
        except BaseException:
            self.close()
            raise

    # -- start-up ---------------------------------------------------------------------------------

    def _start(self, config: TrainConfig, seed: int) -> None:
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

        from swarm.backends.verl import compat, placement

        compat.prepare(self.device)  # trl hidden on every device; the CPU platform on CPU
        worker_config = knobs.worker_config(self.folder, config, device=self.device, seed=seed)
        begin = time.perf_counter()
        self._ray.start()
        self.ray_startup_s = self._ray.startup_s
        import ray

        from swarm.backends.verl.worker import SwarmTrainingWorker

        resource = "CPU" if self._cpu else "GPU"
        free = ray.available_resources().get(resource, 0.0)
        if free < self.workers:  # verl would otherwise wait for the placement group forever
            raise RuntimeError(f"Ray has {free:g} {resource} free but {self.workers} verl workers need one each")
        plan = placement.plan_nodes(self.workers, placement.free_per_node(resource))
        self._pool = placement.resource_pool(plan, use_gpu=not self._cpu)
        worker_cls = RayClassWithInitArgs(cls=ray.remote(SwarmTrainingWorker), config=worker_config, cpu=self._cpu)
        if not self._cpu:  # a second slot: abort_vllm can reach a worker whose NCCL send is stuck
            worker_cls.update_options({"max_concurrency": 2})
        self._group = RayWorkerGroup(resource_pool=self._pool, ray_cls_with_init=worker_cls,
                                     worker_env=compat.worker_env(self.device), device_name=self.device)
        self._group.reset()
        self._group.restrict_vocab(self.vocab_size)
        if config.kl_coef > 0:
            self._group.snapshot_reference()
            self._has_reference = True
        self.startup_s = time.perf_counter() - begin
        logger.info("verl trainer: %d FSDP2 worker(s) on %s (placement groups %s) ready in %.1f s (Ray %.1f s)",
                    self.workers, self.device, plan, self.startup_s, self.ray_startup_s)

    def check_config(self, config: TrainConfig) -> None:
        """``ValueError`` naming a knob verl cannot honour (``knobs.check_supported``), or a LoRA key
        changed after the workers built the model."""
        check_supported(config)
        if knobs.lora_settings(config) != self._lora:
            raise ValueError("lora_rank, lora_alpha and lora_target_modules are fixed when the workers start; "
                             "restart the server to change them")

    def _apply_optimizer(self, config: TrainConfig) -> None:
        wanted = optimizer_settings(config)
        if wanted != self._optimizer:
            self._group.set_optimizer(**wanted)
            self._optimizer = wanted

    # -- the Trainer protocol --------------------------------------------------------------------

    def advantages(self, rewards: Sequence[float], group_ids: Sequence[str], config: TrainConfig) -> list[float]:
        """Episode-level advantages from verl's ``config.adv_estimator`` (as the torch trainer)."""
        from swarm import algorithms

        return algorithms.compute_advantages(rewards, group_ids, config)

    @staticmethod
    def _token_budget(config: TrainConfig, samples: Sequence[TrainSample]) -> int:
        """Tokens per micro-batch: ``micro_batch_tokens``, raised to fit the longest sample alone."""
        return max(config.micro_batch_tokens, max(len(s.tokens) for s in samples))

    def _infer(self, td_data: DataProto, budget: int, key: str = "log_probs", reference: bool = False,
               entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        td = batching.to_no_padding(td_data, calculate_entropy=entropy, compute_loss=False,
                                    max_token_len_per_gpu=budget)
        call = self._group.reference_log_probs if reference else self._group.infer_batch
        output = call(td).get()
        ent = batching.to_padded(output, "entropy", td) if entropy else None
        return batching.to_padded(output, key, td), ent

    def train_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One policy update (``ppo_epochs`` optimizer steps); increments ``policy_version``."""
        check_supported(config)
        start = time.perf_counter()
        samples = batching.trainable_samples(samples, self.vocab_size, self.max_context)
        self._apply_optimizer(config)
        budget = self._token_budget(config, samples)
        packed = batching.pack_samples(samples, self._pad_id, self.workers)
        metrics = self._score_old_policy(packed, budget)
        metrics.update(self._add_corrections(packed, config, budget))
        metrics.update(self._update_policy(packed, config, budget))
        self.policy_version += 1
        elapsed = time.perf_counter() - start
        trained = float(sum(len(s.tokens) for s in samples)) * config.ppo_epochs
        metrics.update({
            "train/response_tokens": packed.tokens,
            "train/samples": float(packed.samples),
            "perf/train_tokens": trained,
            "perf/train_s": elapsed,
            "perf/tokens_per_s": trained / elapsed if elapsed > 0 else 0.0,
        })
        return metrics

    def _score_old_policy(self, packed: batching.PackedBatch, budget: int) -> dict[str, float]:
        """The policy's log-probs of the sampled tokens before the update (PPO's "old" log-probs)."""
        old, entropy = self._infer(packed.data, budget, entropy=True)
        packed.data.batch["old_log_probs"] = old
        metrics = _rollout_metrics(old, packed.rollout, packed.response_mask, packed.tokens, packed.sources)
        metrics["train/entropy"] = float((entropy * packed.response_mask).sum()) / packed.tokens
        return metrics

    def _add_corrections(self, packed: batching.PackedBatch, config: TrainConfig, budget: int) -> dict[str, float]:
        """Rollout importance weights and the KL reference's log-probs, when the config asks for them."""
        batch, mask, metrics = packed.data.batch, packed.response_mask, {}
        if config.rollout_is != "off":
            from swarm import algorithms

            weights, truncated = algorithms.rollout_is_weights(batch["old_log_probs"] - packed.rollout, mask,
                                                               config.rollout_is, config.rollout_is_threshold)
            batch["rollout_is_weights"] = weights
            metrics["train/rollout_is_weight_mean"] = float((weights * mask).sum()) / packed.tokens
            metrics["train/rollout_is_truncated"] = float((truncated * mask).sum()) / packed.tokens
        if config.kl_coef > 0:
            if not self._has_reference:
                logger.warning("kl_coef > 0 but no reference yet: freezing the current policy as the reference")
                self._group.snapshot_reference()
                self._has_reference = True
            batch["ref_log_prob"], _ = self._infer(packed.data, budget, reference=True)
        return metrics

    def _update_policy(self, packed: batching.PackedBatch, config: TrainConfig, budget: int) -> dict[str, float]:
        """verl's ``ppo_loss`` (policy loss by name), one ``train_batch`` per PPO epoch."""
        from verl.workers.utils.losses import ppo_loss

        key = ("ppo", config.model_dump_json(), loss_scale(config, packed.horizon))
        if key != self._loss_key:  # the loss function travels to every worker: only when it changes
            self._group.set_loss_fn(partial(ppo_loss, config=actor_config(config, key[2])))
            self._loss_key = key
        td = batching.to_no_padding(packed.data, global_batch_size=packed.samples, calculate_entropy=False,
                                    compute_loss=True, max_token_len_per_gpu=budget)
        sums = dict.fromkeys(("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "grad_norm", "kl_loss"), 0.0)
        for _ in range(config.ppo_epochs):
            out = _worker_metrics(self._group.train_batch(td).get())
            for name in sums:
                sums[name] += out.get(name, 0.0)
        kl = sums.pop("kl_loss")
        metrics = {f"train/{k}": v / config.ppo_epochs for k, v in sums.items()}
        if config.kl_coef > 0:
            metrics["train/kl"] = kl / config.ppo_epochs  # verl's kl_loss: the KL aggregated like the loss
        return metrics

    def supervised_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One token-mean NLL update on ``loss_mask`` tokens (temperature 1); increments ``policy_version``."""
        from swarm.backends.verl.worker import sft_loss

        start = time.perf_counter()
        samples = batching.trainable_samples(samples, self.vocab_size, self.max_context)
        self._apply_optimizer(config)
        packed = batching.pack_samples(samples, self._pad_id, self.workers, unit_temperature=True)
        if self._loss_key != ("sft",):
            self._group.set_loss_fn(sft_loss)
            self._loss_key = ("sft",)
        td = batching.to_no_padding(packed.data, global_batch_size=packed.samples, compute_loss=True,
                                    max_token_len_per_gpu=self._token_budget(config, samples))
        out = _worker_metrics(self._group.train_batch(td).get())
        self.policy_version += 1
        elapsed = time.perf_counter() - start
        trained = float(sum(len(s.tokens) for s in samples))
        return {
            "sft/loss": out["loss"],
            "sft/grad_norm": out["grad_norm"],
            "sft/tokens": packed.tokens,
            "perf/train_tokens": trained,
            "perf/train_s": elapsed,
            "perf/tokens_per_s": trained / elapsed if elapsed > 0 else 0.0,
        }

    def export_weights(self) -> Weights:
        """The full weights on the CPU with Hugging Face names (gathered from the FSDP shards). On GPU
        they are gathered one parameter at a time and cast to bf16 on the device first."""
        if self._cpu:
            return self._full_state(with_optimizer=False)["weights"]
        return self._group.export_weights("bfloat16")[0]

    # -- streaming into vLLM (GPU) ----------------------------------------------------------------

    def nccl_sender(self, timeout: float = 600.0) -> VerlNcclSender:
        """A ``WeightSender``: the workers stream their parameters into vLLM over NCCL (``sender``)."""
        return VerlNcclSender(self, timeout)

    def worker_call(self, method: str, *args: Any) -> Any:
        """Rank 0's answer to ``method`` called on every worker (the ``sender``'s calls)."""
        return getattr(self._group, method)(*args)[0]

    def _full_state(self, with_optimizer: bool) -> dict[str, Any]:
        return self._group.full_state(with_optimizer)[0]

    # -- checkpoints -----------------------------------------------------------------------------

    def save(self, directory: str) -> None:
        """Write a loadable HF folder + optimizer + reference + ``policy_version`` (see ``checkpoint``)."""
        state = self._full_state(with_optimizer=True)
        reference = self._group.reference_state()[0] if self._has_reference else None
        meta = {"policy_version": self.policy_version, "model_name": self.model_name, "workers": self.workers}
        write_checkpoint(directory, self.folder, Checkpoint(meta, state["weights"], state["optimizer"], reference),
                         tied=self._tied)

    def load(self, directory: str) -> None:
        """Restore what ``save`` wrote, with any number of workers."""
        saved = read_checkpoint(directory, tied=self._tied)
        self._group.load_full_state(saved.weights, saved.optimizer)
        if saved.reference is not None:
            self._group.load_reference(saved.reference)
            self._has_reference = True
        self.policy_version = int(saved.meta["policy_version"])
        self._optimizer = {}  # lr/decay came back from disk: re-apply the live config on the next step

    # -- shutdown --------------------------------------------------------------------------------

    def close(self) -> None:
        """End the workers and disconnect from (or stop) Ray. Idempotent."""
        group, self._group = self._group, None
        pool, self._pool = self._pool, None
        import ray

        if ray.is_initialized():
            for handle in getattr(group, "workers", None) or []:
                try:
                    ray.kill(handle, no_restart=True)
                except (ValueError, ray.exceptions.RayError) as exc:  # a worker already gone is fine
                    logger.debug("could not kill a verl worker: %s", exc)
            for pg in getattr(pool, "pgs", None) or []:  # free the CPUs/GPUs on a shared cluster
                try:
                    ray.util.remove_placement_group(pg)
                except (ValueError, ray.exceptions.RayError) as exc:
                    logger.debug("could not remove a placement group: %s", exc)
        self._ray.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_metrics(output: Any) -> dict[str, float]:
    """verl's ``train_batch`` metrics as floats, ``actor/`` prefix dropped.

    Values arrive per data-parallel rank (a list), each a ``Metric`` over micro-batches or a plain
    list: ``Metric.aggregate_dp`` reduces them the way verl's own trainer does (for the loss terms,
    the global-batch value, since each micro-batch is already scaled by its global share).
    """
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import Metric

    out: dict[str, float] = {}
    for key, value in tu.get(output, "metrics").items():
        if isinstance(value, list) and value and all(isinstance(v, Metric) for v in value):
            value = Metric.aggregate_dp(value)
        elif isinstance(value, Metric):
            value = value.aggregate()
        elif isinstance(value, list):
            flat = list(_flatten(value))
            value = sum(flat) / len(flat) if flat else 0.0
        if isinstance(value, (int, float)) or (hasattr(value, "item") and getattr(value, "size", 1) == 1):
            out[key.removeprefix("actor/")] = float(value)
    return out


def _flatten(values: list) -> Any:
    for v in values:
        if isinstance(v, list):
            yield from _flatten(v)
        elif isinstance(v, (int, float)):
            yield float(v)


def _rollout_metrics(logp: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, tokens: float,
                     sources: Sequence[str] = ()) -> dict[str, float]:
    """Recomputed vs recorded log-probs of the sampled tokens, over ``mask`` tokens (shapes ``(rows, R)``),
    and the worst of them per pool member that sampled a row (``sources``, per row; the server drains
    a member above its bound, as with the torch trainer)."""
    diff = (logp - rollout).abs() * mask
    mean = float(diff.sum()) / tokens
    metrics = {
        "train/rollout_logprob_diff": mean,
        "rollout/logprob_diff_mean": mean,
        "rollout/logprob_diff_max": float(diff.max()),
    }
    worst: dict[str, float] = {}
    worst_by_source(worst, sources, diff.max(dim=1).values.tolist())  # filler rows come after the real ones
    metrics.update({SOURCE_DIFF_PREFIX + source: value for source, value in worst.items()})
    return metrics
