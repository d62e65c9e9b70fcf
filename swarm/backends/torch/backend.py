"""``TorchBackend``: the embedded default backend (a transformers model and a torch optimizer).

It owns one causal LM on the CPU or one GPU (``device``): chat rendering, batched sampling with exact
log-probs, policy-gradient and supervised updates, and atomic checkpoints. In ``bfloat16`` the trained
weights and the optimizer state stay fp32 (the master copy) and the forward passes of an update run
under bf16 autocast; generation uses a bf16 copy of the weights, refreshed after every update, so
sampled and recomputed log-probs come from the same bf16 arithmetic. On a GPU, generation decodes from
a static slot cache with CUDA graphs (``slots``; ``decode_cache``). With ``lora_rank`` > 0 the model
gets peft adapters and only they train; it generates from, publishes and checkpoints merged weights
(``lora``).
Models come from a local Hugging Face folder or from the ``tiny`` preset, which is built once into a
cache folder and then loaded like any other folder. Nothing is ever downloaded.

Not thread-safe by design: the server calls every method from one worker thread.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from swarm import algorithms
from swarm.backends.base import Generation, InProcessModel, RowFeed, SamplingParams, TokenSink, TrainConfig, TrainSample
from swarm.backends.torch import lora as adapters
from swarm.backends.torch import training
from swarm.backends.torch.attention import use_grouped_decode
from swarm.backends.torch.grammar import GrammarCompiler
from swarm.backends.torch.sampling import SamplingSetup, sample_batch
from swarm.backends.torch.slots import SlotPool, supports
from swarm.models.folders import atomic_folder
from swarm.models.resolve import model_name, resolve_model_folder
from swarm.text.templates import ChatText, Message, ToolSpec, load_tokenizer

logger = logging.getLogger(__name__)

__all__ = ["TorchBackend"]

_STATE_FILE = "backend_state.json"
_OPTIMIZER_FILE = "optimizer.pt"
_REFERENCE_FILE = "reference.pt"


def _load_model(folder: Path, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    return model.to(device).eval()


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return frozenset(ids)


class TorchBackend(InProcessModel):
    """Both roles on a transformers causal LM in the server process (``InProcessModel``, see ``swarm.backends.base``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_name: str,
        seed: int = 0,
        reference: bool = False,
        dtype: str = "float32",
        decode_cache: str = "auto",
        lora: adapters.LoraSettings | None = None,
    ) -> None:
        self.lora = lora
        self._autocast = torch.bfloat16 if dtype == "bfloat16" else None
        self._serves_merged = lora is not None and self._autocast is None
        plain = copy.deepcopy(model) if self._serves_merged else None  # taken before the adapters go in
        # peft injects the adapters into ``model`` itself; the backend keeps training ``model`` (see ``lora``).
        self._peft = adapters.apply(model, lora) if lora is not None else None
        self._export_tag = object()  # marks this backend's own merged exports (``load_weights``)
        self.model = model
        use_grouped_decode(model)  # decode steps attend without copying the KV cache (``attention``)
        self.device = str(next(model.parameters()).device)
        self.dtype = dtype
        self.serving = self._serving_copy(plain)
        self.tokenizer = tokenizer
        self.text = ChatText(tokenizer)
        self.model_name = model_name
        self.policy_version = 0
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        self._generator = torch.Generator().manual_seed(seed)
        self._optimizer: torch.optim.Optimizer | None = None
        self._reference: torch.nn.Module | None = self._frozen_copy() if reference else None
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._pad_id = int(pad if pad is not None else 0)
        # Ids past the tokenizer are embedding padding: never sampled, never trained (see sampling).
        self.vocab_size = min(len(tokenizer), int(model.get_input_embeddings().weight.shape[0]))
        eos_ids = _eos_ids(model, tokenizer)
        self._setup = SamplingSetup(
            eos_ids=eos_ids,
            pad_id=self._pad_id,
            vocab_size=self.vocab_size,
            max_context=self.max_context,
            decode=self.decode,
            slots=self._slot_pool(decode_cache),
            grammars=GrammarCompiler(tokenizer, self.vocab_size, eos_ids),
        )

    @classmethod
    def from_model(
        cls,
        model: str,
        config: TrainConfig | None = None,
        *,
        seed: int = 0,
        cache_dir: str | Path | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        decode_cache: str = "auto",
    ) -> TorchBackend:
        """Load ``model`` (a preset such as "tiny" or a local Hugging Face causal-LM folder).

        A reference copy for the KL penalty is made now when ``config.kl_coef > 0`` (otherwise on
        the first update that asks for one).
        """
        folder = resolve_model_folder(model, seed=seed, cache_dir=cache_dir)
        tokenizer = load_tokenizer(folder)
        loaded = _load_model(folder, device)
        name = model_name(model, folder)
        wants_reference = config is not None and config.kl_coef > 0
        logger.info("loaded %s from %s on %s (%s)", name, folder, device, dtype)
        return cls(loaded, tokenizer, model_name=name, seed=seed, reference=wants_reference, dtype=dtype,
                   decode_cache=decode_cache, lora=adapters.LoraSettings.of(config))

    def _serving_copy(self, plain: torch.nn.Module | None) -> torch.nn.Module:
        """The model generation reads. Full fine-tuning in fp32: ``model`` itself. In bf16: a bf16 copy
        (the fp32 ``model`` is what the optimizer updates), whose LoRA adapters stay factored, as a merged
        bf16 weight would round a small update away. LoRA in fp32: ``plain``, a copy taken before the
        adapters went in, serving the merged weights: one matmul a layer at every decoded token instead
        of three (decoding SmolLM2 on CPU ran 2.1x slower through the factored adapters)."""
        if plain is not None:
            use_grouped_decode(plain)
            serving = plain
        elif self._autocast is not None:
            serving = copy.deepcopy(self.model).to(torch.bfloat16)
        else:
            return self.model
        for p in serving.parameters():
            p.requires_grad_(False)
        return serving.eval()  # under LoRA B = 0 so far: the plain weights are the merged ones

    def _refresh_serving(self, only_trained: bool = False) -> None:
        """Bring the serving copy up to the master weights: under fp32 LoRA the merged weights; in bf16
        after an update only the trained ones (all of them for full fine-tuning, the adapters under
        LoRA), after a load every one."""
        if self.serving is self.model:
            return
        with torch.no_grad():
            if self._serves_merged:
                assert self.lora is not None
                self.serving.load_state_dict(adapters.merged(self.model, self.lora))
                return
            for mine, master in zip(self.serving.parameters(), self.model.parameters(), strict=True):
                if master.requires_grad or not only_trained:
                    mine.copy_(master)

    def _slot_pool(self, decode_cache: str) -> SlotPool | None:
        """Static-cache decoding where asked, or by default on a GPU, for models that allow it."""
        wanted = decode_cache in ("static", "compiled") or (decode_cache == "auto" and self.device.startswith("cuda"))
        if wanted and not supports(self.serving):
            logger.warning("%s: static-cache decoding needs full-attention layers; using the growing cache",
                           self.model_name)
            return None
        return SlotPool(self.serving, self.vocab_size, compiled=decode_cache == "compiled") if wanted else None

    def _autocast_context(self) -> Any:
        """bf16 autocast for an update's forward passes (fp32 master weights), else nothing."""
        if self._autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=self._autocast)

    # -- chat and text ---------------------------------------------------------------------------

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None) -> list[int]:
        """Apply the chat template with the generation prompt and return prompt token ids."""
        return self.text.render(messages, tools)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode ids to text, skipping special tokens."""
        return self.text.decode(token_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without special tokens."""
        return self.text.encode(text)

    @property
    def eos_token_id(self) -> int:
        """The end-of-turn id (``<|im_end|>`` for the tiny preset)."""
        return int(self.tokenizer.eos_token_id)

    # -- generation -------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[SamplingParams],
        on_token: TokenSink | None = None,
        feed: RowFeed | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt row in one batched loop (see ``sampling``).

        With a ``feed`` rows may join while it runs (continuous batching; see ``RowFeed``)."""
        if not prompts and feed is None:
            return []
        self.serving.eval()
        return sample_batch(self.serving, prompts, params, self._setup, self._generator, on_token, feed)

    # -- training --------------------------------------------------------------------------------

    def _frozen_copy(self) -> torch.nn.Module:
        reference = copy.deepcopy(self.model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
        return reference

    def _optimizer_for(self, config: TrainConfig) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(adapters.trainable(self.model), lr=config.lr,
                                                weight_decay=config.weight_decay)
        for group in self._optimizer.param_groups:  # live-patched hyper-parameters take effect here
            group["lr"] = config.lr
            group["weight_decay"] = config.weight_decay
        return self._optimizer

    def _pack(self, samples: Sequence[TrainSample]) -> training.Batch:
        return training.pack(samples, self._pad_id, self.vocab_size, self.max_context)

    def train_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One policy-gradient update; increments ``policy_version``; returns slash-keyed metrics."""
        batch = self._pack(samples)
        algorithms.policy_loss_fn(config.policy_loss)  # unknown names fail before anything changes
        if config.kl_coef > 0 and self._reference is None:
            logger.warning("kl_coef > 0 but no reference yet: freezing the current policy as the reference")
            self._reference = self._frozen_copy()
        with self._autocast_context():
            metrics = training.policy_update(
                self.model, self._optimizer_for(config), self._reference, batch, config, self.vocab_size
            )
        self._refresh_serving(only_trained=True)
        self.policy_version += 1
        return metrics

    def check_config(self, config: TrainConfig) -> None:
        """Every ``TrainConfig`` knob is honoured here; unknown loss names fail when a step runs. The
        LoRA keys are fixed when the model loads: ``ValueError`` for a change."""
        if adapters.LoraSettings.of(config) != self.lora:
            raise ValueError("lora_rank, lora_alpha and lora_target_modules are fixed when the model loads "
                             f"(rank {self.lora.rank if self.lora else 0}); restart the server to change them")

    def advantages(self, rewards: Sequence[float], group_ids: Sequence[str], config: TrainConfig) -> list[float]:
        """Episode-level advantages from verl's ``config.adv_estimator``."""
        return algorithms.compute_advantages(rewards, group_ids, config)

    def supervised_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One NLL update on ``loss_mask`` tokens; increments ``policy_version``."""
        batch = self._pack(samples)
        with self._autocast_context():
            metrics = training.supervised_update(self.model, self._optimizer_for(config), batch, config,
                                                 self.vocab_size)
        self._refresh_serving(only_trained=True)
        self.policy_version += 1
        return metrics

    # -- weight publication ------------------------------------------------------------------------

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The live parameters by Hugging Face name (no copy: read them before the next update); under
        LoRA the adapted layers merged (``W + alpha/r * B @ A``, new tensors; the model is unchanged)."""
        if self.lora is None:
            return dict(self.model.state_dict())
        return _OwnExport(adapters.merged(self.model, self.lora), self._export_tag)

    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Serve ``weights`` as policy ``version``. Tensors that already are this model's own (the
        generator and trainer are one backend) are not copied; anything else is loaded in place.
        Under LoRA this backend's own merged export is already what it serves; other plain weights
        replace the base layers and zero the adapters (``lora.load_plain``)."""
        if self.lora is not None:
            if getattr(weights, "tag", None) is not self._export_tag:
                adapters.load_plain(self.model, weights)
                self._refresh_serving()
            self.policy_version = version
            return
        own = self.model.state_dict()
        if any(name not in own for name in weights):
            unknown = sorted(set(weights) - set(own))[:5]
            raise ValueError(f"published weights do not fit this model: unknown parameters {unknown}")
        with torch.no_grad():
            for name, tensor in weights.items():
                target = own[name]
                if target.data_ptr() != tensor.data_ptr():
                    target.copy_(tensor.to(target.device, target.dtype))
        self._refresh_serving()
        self.policy_version = version

    # -- checkpoints -----------------------------------------------------------------------------

    def save(self, directory: str) -> None:
        """Write weights + tokenizer (a loadable HF folder), optimizer, reference and version, atomically."""
        with atomic_folder(directory) as staging:
            if self._peft is not None and self.lora is not None:  # the policy merged, and the adapter itself
                self.model.save_pretrained(staging, state_dict=adapters.merged(self.model, self.lora))
                adapters.save_adapter(self._peft, staging)
            else:
                self.model.save_pretrained(staging)
            self.tokenizer.save_pretrained(staging)
            if self._optimizer is not None:
                torch.save(self._optimizer.state_dict(), staging / _OPTIMIZER_FILE)
            if self._reference is not None:
                torch.save(self._reference.state_dict(), staging / _REFERENCE_FILE)
            state = {"policy_version": self.policy_version, "model_name": self.model_name}
            (staging / _STATE_FILE).write_text(json.dumps(state))

    def load(self, directory: str) -> None:
        """Restore what ``save`` wrote (weights, optimizer, reference, ``policy_version``). Under LoRA
        the adapter is restored onto this model's frozen base, which must be the one it was trained on."""
        folder = Path(directory)
        state_file = folder / _STATE_FILE
        if not state_file.is_file():
            raise ValueError(f"{folder} is not a checkpoint written by TorchBackend.save (no {_STATE_FILE})")
        state = json.loads(state_file.read_text())
        device = next(self.model.parameters()).device
        loaded = _load_model(folder, str(device))
        if self._peft is not None and self.lora is not None:
            adapters.load_adapter(self._peft, folder, self.lora)
            _check_same_policy(adapters.merged(self.model, self.lora), loaded.state_dict(), folder)
        elif (folder / adapters.ADAPTER_DIR).is_dir():
            raise ValueError(f"{folder} holds a LoRA adapter: resume it with the lora_rank it was trained with")
        else:
            self.model.load_state_dict(loaded.state_dict())
        self._optimizer = None
        if (folder / _OPTIMIZER_FILE).is_file():
            optimizer = torch.optim.AdamW(adapters.trainable(self.model))
            optimizer.load_state_dict(torch.load(folder / _OPTIMIZER_FILE, map_location=device, weights_only=True))
            self._optimizer = optimizer
        if (folder / _REFERENCE_FILE).is_file():
            if self._reference is None:
                self._reference = self._frozen_copy()
            self._reference.load_state_dict(torch.load(folder / _REFERENCE_FILE, map_location=device, weights_only=True))
        self._refresh_serving()
        self.policy_version = int(state["policy_version"])


class _OwnExport(dict[str, torch.Tensor]):
    """A LoRA backend's merged export, tagged so that loading it back into the same backend (the
    generator and trainer are one) changes nothing."""

    def __init__(self, weights: dict[str, torch.Tensor], tag: object) -> None:
        super().__init__(weights)
        self.tag = tag


def _check_same_policy(merged: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor], folder: Path) -> None:
    """``ValueError`` unless base + restored adapter give the merged weights the checkpoint holds
    (a resume on another base model than the one the adapter was trained on)."""
    for name, tensor in saved.items():
        mine = merged.get(name)
        if mine is None or mine.shape != tensor.shape or not torch.allclose(mine, tensor, rtol=1e-5, atol=1e-6):
            raise ValueError(f"{folder}: its adapter was trained on another base model than this one "
                             f"({name} differs); resume with the --model it was trained on")
