"""The contract between the server's engine and the engines that own the model.

A server is composed of one **generator** and one **trainer**, chosen by name
(``swarm serve --engine torch|vllm --trainer torch|verl``):

- ``Generator`` renders chat messages into prompt ids and samples continuations (ids + log-probs,
  exactly as sampled), tagging every result with the policy version of the weights that produced
  it. It is awaited on the server's event loop: the torch generator batches requests on the device
  thread, the vLLM generator sends token ids to a vLLM server.
- ``Trainer`` computes advantages, runs policy and supervised updates on finished samples, exports
  its weights and saves/loads checkpoints. Its methods block, so the engine runs them off the event
  loop (on the device thread).

After every update the engine publishes the trainer's weights to the generator explicitly
(``Generator.load_weights(version, weights)``); that call is what moves the version completions are
tagged with. The torch backend plays both roles in the server process (``InProcessModel``): a
``Trainer``, and a ``Sampler`` the device thread drives synchronously, which the server adapts to
the ``Generator`` role. Optional hooks are declared here with their defaults, so a role that does
not need one inherits it and the server never asks ``hasattr``. Everything here is plain Python so
the server can import it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from swarm.backends.text import ChatText

# A sampled token's most likely alternatives, most likely first: (token id, log-prob) pairs.
TopAlternatives = list[tuple[int, float]]
# Called once per sampled token: (row index, token id, log-prob, its top alternatives or None when the
# row asked for none). The torch sampler calls it on the generation thread; a streamed request's sink
# is called with the same arguments on the event loop (row = choice index).
TokenSink = Callable[[int, int, float, "TopAlternatives | None"], None]
# A full state dict on the CPU, Hugging Face parameter names -> torch tensors (typed loosely: no torch here).
Weights = Mapping[str, Any]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one prompt row (one row per returned choice).

    The fields after ``top_logprobs`` are vLLM's sampling extensions with vLLM's meaning: ``top_k``
    (0: off), ``min_p`` (0: off), ``repetition_penalty`` (1: off; over prompt and output),
    ``presence_penalty``/``frequency_penalty`` (0: off; over output tokens), ``min_tokens`` (no
    end-of-turn or stop token before that many), ``ignore_eos`` (run to ``max_tokens``),
    ``stop_token_ids`` (extra ids that end the row, kept in its ids like the end-of-turn token); then
    OpenAI's ``logit_bias`` (added to the raw logits with ``min_tokens``' masking, before penalties:
    -100 bans an id).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # alternatives to report per sampled token (0: none)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), OpenAI's logit_bias


@dataclass(frozen=True)
class Generation:
    """One sampled continuation.

    ``token_ids`` decode to exactly the text returned to the client: on a stop string the ids are
    cut before the token where the stop string begins. ``logprobs[i]`` is the log-probability the
    token was drawn with: ``log_softmax`` of the logits after the penalties (repetition, presence,
    frequency) and ``/ temperature``, with ``min_p``/``top_k``/``top_p`` applied and the kept ids
    renormalised (vLLM's ``processed_logprobs``, on both engines). Greedy rows record it at
    temperature 1 (penalties applied, no truncation). ``top_logprobs`` come from the same
    distribution. Without penalties or truncation this is ``log_softmax(logits / temperature)``,
    exactly what the trainer recomputes; the trainer knows nothing of penalties or truncation, so rows
    that use them differ from its recomputation and ``TrainConfig.rollout_is`` corrects for it.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    # With ``SamplingParams.top_logprobs = k``: per sampled token, the k most likely (id, log-prob).
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class Sampled:
    """What one generation request got back: one row per choice, and the policy version that produced them."""

    generations: list[Generation]
    policy_version: int
    source: str | None = None  # the pool member that produced them (per-worker accounting); None: not pooled


@dataclass
class TrainSample:
    """One training sequence: a (possibly merged) timeline of an episode.

    ``tokens`` is prompt and completions interleaved; ``loss_mask[i]`` is 1 where ``tokens[i]``
    was generated by the policy and 0 for system/user/tool tokens. ``rollout_logprobs[i]`` is the
    log-prob recorded at generation for generated tokens (0.0 elsewhere). ``advantage`` is the
    episode-level advantage, broadcast over the generated tokens by the backend.
    """

    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float
    temperature: float = 1.0
    policy_versions: list[int] = field(default_factory=list)
    source: str = ""  # the generator-pool member that sampled it ("": not known, or several)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"sample lengths differ: tokens={n} mask={len(self.loss_mask)} "
                f"logprobs={len(self.rollout_logprobs)}"
            )
        if not math.isfinite(self.advantage):
            raise ValueError(f"advantage must be finite, got {self.advantage}")


def validate_samples(samples: Sequence[TrainSample], vocab_size: int, max_context: int) -> None:
    """``ValueError`` on anything a trainer cannot train (every trainer applies the same rules)."""
    if not samples:
        raise ValueError("no samples to train on")
    for i, s in enumerate(samples):
        if len(s.tokens) < 2:
            raise ValueError(f"sample {i} has fewer than 2 tokens")
        if len(s.tokens) > max_context:
            raise ValueError(f"sample {i} has {len(s.tokens)} tokens, more than the context of {max_context}")
        if min(s.tokens) < 0 or max(s.tokens) >= vocab_size:
            raise ValueError(f"sample {i}: token ids must lie in [0, {vocab_size})")
        if any(m not in (0, 1) for m in s.loss_mask):
            raise ValueError(f"sample {i}: loss_mask must hold only 0 and 1")
        if s.temperature < 0:
            raise ValueError(f"sample {i}: temperature must be >= 0")
    if not any(1 in s.loss_mask[1:] for s in samples):
        raise ValueError("samples have no trainable tokens (loss_mask is 0 everywhere after the first token)")


# A trainer reports the worst log-prob mismatch of each pool member's samples under this prefix
# (``<prefix><member id>``), so the server can drain a member that serves the wrong model.
SOURCE_DIFF_PREFIX = "pool/logprob_diff_max/"


def worst_by_source(worst: dict[str, float], sources: Sequence[str], row_max: Sequence[float]) -> None:
    """Fold each row's worst mismatch into ``worst`` under the pool member that sampled the row (rows
    without a known member, "", and any rows past ``sources`` are skipped)."""
    for source, value in zip(sources, row_max):
        if source:
            worst[source] = max(worst.get(source, 0.0), value)


RolloutIS = Literal["off", "token", "sequence"]
ROLLOUT_IS_HELP = "importance weights against the rollout log-probs: off, per token or per sequence"


class TrainConfig(BaseModel):
    """Hyper-parameters of the policy update. Validated when built; live-patchable by the server."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: float = Field(1e-3, gt=0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    adv_estimator: str = Field("grpo", description="verl core_algos advantage estimator name")
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group's std")
    policy_loss: str = Field("vanilla", description="verl core_algos policy loss name")
    loss_agg_mode: str = Field("token-mean", description="verl agg_loss mode")
    clip_ratio: float = Field(0.2, gt=0, lt=1)
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference penalty; 0 disables the reference")
    kl_penalty: str = Field("low_var_kl", description="verl kl_penalty kind")
    ppo_epochs: int = Field(1, ge=1, le=16)
    micro_batch_tokens: int = Field(8192, ge=64, description="token budget per forward pass")
    # Off-policy correction (verl's rollout_correction): weight each token's loss by the truncated
    # ratio pi_train / pi_rollout of the policy now to the one that sampled it. It matters for async
    # samples generated by an older policy; on-policy samples get weights of ~1.
    rollout_is: RolloutIS = Field("off", description=ROLLOUT_IS_HELP)
    rollout_is_threshold: float = Field(2.0, gt=0, description="upper bound the importance weights are truncated to")

    @classmethod
    def training_fields(cls) -> dict[str, Any]:
        """The fields that configure the policy update (a subclass adding engine knobs narrows it),
        so a trainer can refuse the ones it cannot honour and ignore the rest."""
        return dict(cls.model_fields)

    @field_validator("loss_agg_mode")
    @classmethod
    def _known_agg_mode(cls, value: str) -> str:
        allowed = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
        if value not in allowed:
            raise ValueError(f"loss_agg_mode must be one of {sorted(allowed)}")
        return value


class RowFeed(Protocol):
    """Continuous batching: lets rows join a running ``generate`` and leave it one by one.

    Row indices (for ``on_token`` too) number the initial prompts first, then admitted rows in the
    order ``admit`` returned them. All methods are called from the generation thread.
    """

    def admit(self) -> Sequence[tuple[Sequence[int], SamplingParams]]:
        """New rows to add now (called before the first step and between decode steps)."""
        ...

    def finished(self, row: int, generation: Generation) -> None:
        """Row ``row`` is done; called as soon as it finishes, not when the whole batch ends."""
        ...

    def rejected(self, row: int, error: ValueError) -> None:
        """Admitted row ``row`` cannot be served (bad prompt or params); it never ran."""
        ...

    def cancelled(self, row: int) -> bool:
        """Whether running row ``row`` should stop at the next decode step (its caller went away);
        it is then handed to ``finished`` with what it has. Default: never."""
        return False


class GeneratorUnavailable(RuntimeError):
    """The generator cannot serve right now (its engine restarts, a weight update failed half-way);
    retry after ``retry_after`` seconds. The server answers chat calls with a 503."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(0.0, float(retry_after))


@runtime_checkable
class Generator(Protocol):
    """Sampling with exact tokens: token prompts + sampling params -> ids, log-probs and the policy
    version of the weights that produced them. Owned by the engine; awaited on its event loop."""

    model_name: str
    max_context: int
    eos_token_id: int
    reports_top_logprobs: bool  # fills ``Generation.top_logprobs`` when asked
    text: ChatText  # the tokenizer's text rules: rendering, encoding, decoding, drift-repair splices
    # Optional hooks, with the defaults of a generator that needs none of them:
    mode: Literal["sync", "async"] = "async"  # the server's mode, set before every publication
    streams_weights: bool = False  # True: the trainer streams weights to it (``load_streamed``)
    start_timeout: float = 0.0  # seconds a restart (``recover``) may take beyond ``publish_timeout_s``
    restarts_on_recover: bool = False  # ``recover`` restarts a process (reported in ``generator.recovered``)
    on_status: Callable[[Any], None] | None = None  # called when its own health changes (a vLLM child)

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are sampled with."""
        ...

    @property
    def available(self) -> bool:
        """False while the engine cannot serve (e.g. restarting): chat calls then get a 503."""
        ...

    def describe(self) -> dict[str, Any]:
        """Engine name and health for ``/api/v1/status`` (JSON-ready)."""
        ...

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        """One row per prompt; ``sink`` receives each token as it is sampled (streaming).
        ``affinity`` is a routing hint: calls with the same affinity (an episode's id) prefer the same
        engine, so the prefix they share stays warm in its cache; a single engine ignores it.
        ``ValueError`` for prompts or params it cannot serve (the caller's mistake)."""
        ...

    async def load_weights(self, version: int, weights: Weights) -> None:
        """Serve ``weights`` as policy ``version`` from now on (requests already running may finish
        on the old weights and keep the old tag)."""
        ...

    async def load_streamed(self, version: int) -> None:
        """Serve the weights the trainer streams now as ``version`` (only when ``streams_weights``)."""
        raise NotImplementedError(f"{type(self).__name__} does not receive streamed weights")

    async def recover(self, version: int, weights: Weights) -> None:
        """After a failed publication: serve ``weights`` as ``version`` again, restarting whatever
        must be restarted. Default: load them again."""
        await self.load_weights(version, weights)

    async def start(self) -> None:
        """Get ready to serve (start threads or child processes)."""
        ...

    async def close(self) -> None:
        """Stop whatever ``start`` started."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """Policy updates on finished samples. Methods block; the engine calls them off the event loop,
    one at a time."""

    policy_version: int

    def advantages(self, rewards: Sequence[float], group_ids: Sequence[str], config: TrainConfig) -> list[float]:
        """Episode-level advantages from verl's estimator ``config.adv_estimator`` (one per reward)."""
        ...

    def train_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One policy update; increments ``policy_version``; returns slash-keyed metrics."""
        ...

    def supervised_step(self, samples: Sequence[TrainSample], config: TrainConfig) -> dict[str, float]:
        """One NLL update on ``loss_mask`` tokens; increments ``policy_version``; metrics include ``sft/loss``."""
        ...

    def export_weights(self) -> Weights:
        """The current weights as a full CPU state dict with Hugging Face names."""
        ...

    def check_config(self, config: TrainConfig) -> None:
        """``ValueError`` naming a knob this trainer cannot honour (checked at start and on PATCH)."""
        ...

    def save(self, directory: str) -> None:
        """Write weights (a loadable Hugging Face folder), optimizer state and ``policy_version``."""
        ...

    def load(self, directory: str) -> None:
        """Restore what ``save`` wrote."""
        ...

    def close(self) -> None:
        """Release what the trainer holds beyond the server's device thread (Ray workers). Default: nothing."""


@runtime_checkable
class Sampler(Protocol):
    """Synchronous generation on the server's device thread (the torch model): the server adapts it
    to the ``Generator`` role (``swarm.server.generation.LocalGenerator``). Called from one thread."""

    policy_version: int
    model_name: str
    max_context: int
    eos_token_id: int  # the end-of-turn token a finished assistant message ends with
    text: ChatText  # the tokenizer's text rules

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                 on_token: TokenSink | None = None, feed: RowFeed | None = None) -> list[Generation]:
        """Sample one continuation per prompt row in one batched forward loop. With a ``feed`` the
        loop is continuous: rows may join between decode steps and each row is reported the moment
        it finishes (see ``RowFeed``). Returns the initial rows' generations."""
        ...

    def load_weights(self, version: int, weights: Weights) -> None:
        """Take ``weights`` (a trainer's export) as policy ``version``."""
        ...


@runtime_checkable
class InProcessModel(Sampler, Trainer, Protocol):
    """One model in the server process playing both roles (the default torch backend): the device
    thread samples from it and trains it."""
