"""The Ray worker the verl trainer runs: verl's ``TrainingWorker`` plus what the swarm engine needs.

Runs inside Ray worker processes (imported there when Ray unpickles the actor class). Everything
verl's ``TrainingWorker`` offers is used as is (``reset``, ``set_loss_fn``, ``infer_batch``,
``train_batch``); this subclass adds only the calls verl 0.9.1 has no public method for:

- ``restrict_vocab``: log-probs over the ids the tokenizer knows (as the generator samples them);
- ``set_optimizer``: live hyper-parameters (lr, weight decay, gradient clip) between steps;
- ``full_state`` / ``load_full_state``: world-size-independent weights and optimizer state
  (torch.distributed.checkpoint full state dicts, Hugging Face parameter names), gathered to or
  sent from the driver, so a checkpoint saved with N workers loads with M;
- ``snapshot_reference`` / ``reference_log_probs`` (+ ``reference_state`` / ``load_reference`` for
  checkpoints): a frozen copy of this rank's parameter shards for the KL penalty, swapped in for
  one forward pass (no second model or worker group);
- ``export_weights``: the weights for a generator, gathered one parameter at a time and cast on the
  device (bf16 on GPU), collected on the CPU by rank 0 only;
- ``probe_weight_sender`` / ``connect_vllm`` / ``send_to_vllm`` / ``abort_vllm``: streaming the
  parameters into vLLM over NCCL from here (``swarm.weights.nccl``; GPU only, not run on this
  project's CPU machines). On GPU the actor runs two calls at a time, so ``abort_vllm`` can tear
  down a group whose ``send_to_vllm`` is stuck.

On CPU the worker first creates a plain gloo process group (``cpu_platform.init_process_group``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.torch_functional import masked_sum
from verl.workers.config import TrainingWorkerConfig
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.padding import no_padding_2_padding

from swarm.backends.verl import cpu_platform

if TYPE_CHECKING:
    from swarm.weights.nccl import NcclLink

__all__ = ["SwarmTrainingWorker", "sft_loss"]


def sft_loss(model_output: dict[str, torch.Tensor], data: TensorDict, dp_group: object = None,
             config: object = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean NLL over ``response_mask`` tokens of the whole (global) batch.

    verl's own ``sft_loss`` expects a full-length ``loss_mask`` from its SFT dataset; our batches
    carry the RL layout (prompt + response, mask on the response), so the mask is applied to the
    response slice of the log-probs, normalised like verl's losses (``batch_num_tokens * dp_size``).
    """
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    mask = data.select("response_mask").to_padded_tensor()["response_mask"].to(bool)
    loss = -masked_sum(log_prob, mask) / data["batch_num_tokens"] * data["dp_size"]
    return loss, {}


class SwarmTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker`` with live optimizer settings, full state and a KL reference."""

    def __init__(self, config: TrainingWorkerConfig, cpu: bool = False):
        if cpu:
            cpu_platform.init_process_group()
        super().__init__(config)
        self._reference: list[torch.Tensor] | None = None
        self._vocab_hook = None
        self._vllm: NcclLink | None = None  # the NCCL link into vLLM

    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.engine.module.parameters()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restrict_vocab(self, size: int) -> None:
        """Keep only the first ``size`` logits (the ids the tokenizer knows).

        Embedding rows past the tokenizer are padding: never sampled, so log-probs and entropy are
        taken over the real vocabulary only, as the generator samples and the torch trainer trains.
        """
        head = self.engine.module.get_output_embeddings()
        if self._vocab_hook is not None:
            self._vocab_hook.remove()
            self._vocab_hook = None
        if size < head.out_features:
            self._vocab_hook = head.register_forward_hook(lambda module, args, output: output[..., :size])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_optimizer(self, lr: float, weight_decay: float, clip_grad: float) -> None:
        """Apply live hyper-parameters; the lr scheduler is never stepped, so they stay as set."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
            group["initial_lr"] = lr
            group["weight_decay"] = weight_decay
        scheduler = self.engine.lr_scheduler
        if scheduler is not None:
            scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
        self.engine.optimizer_config.clip_grad = clip_grad

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_state(self, with_optimizer: bool) -> dict | None:
        """Full CPU weights (HF names) and optionally optimizer state; returned by rank 0 only.

        Every rank must take part: gathering the shards is a collective."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        module = self.engine.module
        weights = get_model_state_dict(module, options=options)
        optimizer = get_optimizer_state_dict(module, self.engine.optimizer, options=options) if with_optimizer else None
        if self.rank != 0:
            return None
        return {"weights": {k: v.detach().clone() for k, v in weights.items()}, "optimizer": optimizer}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_full_state(self, weights: dict, optimizer: dict | None) -> None:
        """Load full weights (and optimizer state) into this rank's shards."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        module = self.engine.module
        set_model_state_dict(module, weights, options=options)
        if optimizer is not None:
            set_optimizer_state_dict(module, self.engine.optimizer, optimizer, options=options)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_weights(self, dtype: str) -> dict | None:
        """Full weights (HF names) cast to ``dtype`` on the device, on rank 0's CPU; one parameter is
        gathered at a time (a collective: every rank takes part), never a whole state dict."""
        from swarm.weights.nccl import ParamStream

        out: dict[str, torch.Tensor] = {}
        for name, tensor in ParamStream(self.engine.module.named_parameters, dtype=getattr(torch, dtype)):
            if self.rank == 0:
                out[name] = tensor.to("cpu")
        lora = self.config.model_config
        if self.rank == 0 and lora.lora_rank > 0:  # merge-on-publish, as the torch trainer (swarm.weights.lora)
            from swarm.weights.lora import merge_lora

            out = merge_lora(out, lora.lora_alpha / lora.lora_rank)
        return out if self.rank == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def probe_weight_sender(self) -> dict:
        """Whether this worker can stream into vLLM: CUDA, and vLLM's NCCL engine importable here."""
        from dataclasses import asdict

        from swarm.weights.nccl import probe_here

        return asdict(probe_here("the verl workers"))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_vllm(self, url: str, timeout: float) -> None:
        """Join vLLM's weight-transfer group (rank 0 opens it; the other ranks only gather)."""
        from swarm.weights.nccl import NcclLink, ParamStream

        if self.config.model_config.lora_rank > 0:  # the stream sends parameters as they are: peft's, unmerged
            raise RuntimeError("lora_rank > 0 under the verl trainer publishes merged weights by disk only: "
                               "use --weight-transfer disk")
        self.abort_vllm()
        link = NcclLink(url, ParamStream(self.engine.module.named_parameters), rank=self.rank, timeout=timeout)
        link.connect()
        self._vllm = link

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_to_vllm(self) -> None:
        """Stream the current parameters into vLLM (bf16, per parameter, packed buckets)."""
        if self._vllm is None:
            raise RuntimeError("connect_vllm first")
        self._vllm.send()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_vllm(self) -> None:
        """Tear the weight-transfer group down (unblocks a stuck send); connect again before sending."""
        link, self._vllm = self._vllm, None
        if link is not None:
            link.abort()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def snapshot_reference(self) -> None:
        """Freeze the current policy (this rank's shards) as the KL reference."""
        with torch.no_grad():
            self._reference = [_local(p).clone() for p in self._params()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reference_state(self) -> dict | None:
        """Full reference weights (HF names) on rank 0, or None without a reference (collective)."""
        if self._reference is None:
            return None
        with self._swapped(self._reference):
            state = self.full_state(with_optimizer=False)
        return None if state is None else state["weights"]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_reference(self, weights: dict) -> None:
        """Make the full ``weights`` this rank's KL reference (the policy itself is unchanged)."""
        params = self._params()
        with torch.no_grad():
            current = [_local(p).clone() for p in params]
        self.load_full_state(weights, None)
        with torch.no_grad():
            self._reference = [_local(p).clone() for p in params]
            for p, cur in zip(params, current, strict=True):
                _local(p).copy_(cur)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def reference_log_probs(self, data: TensorDict) -> TensorDict:
        """``infer_batch`` with the reference shards swapped in for the forward pass."""
        if self._reference is None:
            raise RuntimeError("no KL reference: call snapshot_reference first")
        with self._swapped(self._reference):
            return self.infer_batch(data)

    @contextlib.contextmanager
    def _swapped(self, shards: list[torch.Tensor]) -> Iterator[None]:
        """Run with ``shards`` in place of this rank's parameter shards, then put them back."""
        params = self._params()
        with torch.no_grad():
            current = [_local(p).clone() for p in params]
            for p, shard in zip(params, shards, strict=True):
                _local(p).copy_(shard)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, cur in zip(params, current, strict=True):
                    _local(p).copy_(cur)


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter (a DTensor), or the tensor itself."""
    return param.to_local() if hasattr(param, "to_local") else param.data
