"""Server settings: fixed process settings and the live, patchable training configuration.

``ServerConfig`` extends the backend's ``TrainConfig`` with the server's knobs, so one flat set of
keys is what ``--config FILE`` (TOML), ``PATCH /api/v1/config`` and ``swarm config URL k=v`` use;
``SECTIONS`` groups them by concern for people (help, ``swarm config``, tables in a config file).
``starting_config`` completes what a file and flags set with defaults for the model (a pretrained
model's learning rate is not the tiny presets').
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarm.backends.base import TrainConfig
from swarm.backends.recipes import recipe_keys
from swarm.defaults import server_defaults
from swarm.protocol import ConfigDefaults
from swarm.text.parsers import check_parser_names

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

# Real text averages about four characters a token, so at this many per context token the default
# ``max_prompt_chars`` turns away only prompts that would not fit anyway, before paying to tokenise them.
PROMPT_CHARS_PER_TOKEN = 16


class ServerConfig(TrainConfig):
    """Everything ``PATCH /api/v1/config`` may change while the server runs."""

    # Batching: a step fires when ``batch_groups`` groups are complete.
    group_size: int = Field(8, ge=1, le=1024, description="default GRPO group size")
    batch_groups: int = Field(4, ge=1, le=4096, description="complete groups per training step")
    min_group_size: int = Field(2, ge=1, description="groups with fewer finished members are dropped")
    batch_mode: Literal["groups", "episodes", "varied_groups"] = Field(
        "groups", description="count groups, episodes, or only groups whose rewards differ"
    )
    # Staleness: sync drains in-flight episodes before an update; async drops samples too old.
    mode: Literal["sync", "async"] = Field("async", description="sync: drain in-flight episodes before each "
                                           "update; async: keep serving, drop samples older than max_staleness")
    max_staleness: int = Field(1, ge=0, le=64, description="async: oldest policy lag a sample may have")
    admission: bool = Field(True, description="refuse (429 + Retry-After) claims and first chat calls that could "
                            "not finish within max_staleness instead of dropping them at the step "
                            "(swarm.server.flow.admission); false: admit all, drop what is stale")
    # Generation defaults (used when a request leaves them unset).
    temperature: float = Field(1.0, ge=0.0, le=4.0, description="sampling temperature of calls that set none")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling of calls that set none")
    max_tokens: int | None = Field(None, ge=1, description="completion length of a call that sets no max_tokens "
                                   "(the default_max_tokens of vLLM-style servers); unset: the rest of the model's "
                                   "context (its length minus the prompt's), as OpenAI and vLLM answer, so an agent "
                                   "that sends none is never cut off at an arbitrary length")
    # Whose temperature/top_p a training episode's call samples with (``swarm.server.call_sampling``).
    client_sampling: Literal["honor", "pin"] = Field(
        "honor", description="honor (default): a training call samples at the temperature and top_p it sends, as "
        "OpenAI and vLLM do (a client that sets them, e.g. greedy turns of a tool loop, keeps its meaning); pin: they "
        "are held at temperature and top_p above, so a framework that sends temperature 0.1 cannot collapse a GRPO "
        "group; eval and control-token calls are always honoured; status counts both (client_sampling)")
    # Context tracking.
    merge_timelines: bool = Field(True, description="merge a multi-turn episode's calls into one sample "
                                  "where each call extends the last (else one sample a call)")
    # The agent protocol (vLLM's parser names): how replies become tool_calls and reasoning_content.
    tool_call_parser: str = Field("auto", description="hermes, llama3_json, none, or auto (by the chat template)")
    reasoning_parser: str | None = Field(None, description="qwen3 or deepseek_r1: <think> text to "
                                         "reasoning_content; unset: none")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="chat-template variables "
                                                 "every call gets (a request's own override them)")
    # Episodes.
    lease_s: float = Field(60.0, gt=0, le=3600, description="seconds a claimed episode is held for its "
                           "client; heartbeats extend it, an expired one is claimable again")
    category_ratios: dict[str, float] = Field(default_factory=dict, description="target batch mix")
    # Throughput: how long the batcher waits to collect concurrent requests into one forward pass.
    batch_window_ms: float = Field(5.0, ge=0, le=1000, description="how long the batcher waits to gather "
                                   "concurrent requests into one forward pass")
    max_batch_rows: int = Field(64, ge=1, le=4096, description="generation rows decoded together")
    # Bounds: what one request, one credential or one episode may cost (a 4xx beyond each, never a hang).
    max_prompt_chars: int | None = Field(
        None, ge=1, description="characters of message and tool text one chat call may send, checked before "
        f"tokenising (400 beyond); default {PROMPT_CHARS_PER_TOKEN} x the model's context length")
    max_queued_rows: int = Field(256, ge=0, le=65536, description="generation rows that may wait beyond "
                                 "max_batch_rows running ones; chat calls beyond them get 429 + Retry-After")
    max_inflight_per_key: int = Field(32, ge=1, le=4096, description="chat calls one credential (an episode "
                                      "key or the control token) may have running; more get 429 + Retry-After")
    max_episode_tokens: int = Field(1_048_576, ge=1, description="tokens one episode's trace may record; a "
                                    "chat call that could go beyond gets 409")
    max_event_subscribers: int = Field(32, ge=1, le=4096, description="concurrent GET /api/v1/events "
                                       "streams; more get 429 + Retry-After")
    # Durability.
    checkpoint_every: int = Field(0, ge=0, description="steps between checkpoints; 0 = only on request/stop")
    # Storage (swarm.server.durability.retention). The default bounds a run of days: a restart resumes from a kept
    # checkpoint, and nothing trained at or before the oldest one can train again, so its trace and row
    # are kept for audit only; export them (retention_export_dir, or `swarm export`) to keep them.
    retention: Literal["all", "since_checkpoint"] = Field(
        "since_checkpoint", description="since_checkpoint (default, for runs longer than a day): after each "
        "checkpoint, prune the episodes trained at or before the oldest kept checkpoint's step (no restart can "
        "train them again): their traces and rows go, a ~27-byte record each (id, step) stays, so counts, the "
        "exactly-once audit and retried finishes hold; all: keep everything (the buffer grows ~1 KB an episode)")
    retention_export_dir: str | None = Field(None, description="since_checkpoint: first write the episodes about "
                                             "to be pruned to <dir>/episodes-steps-A-B.parquet (`swarm export`'s "
                                             "rows; relative to the state dir); a failed export drops nothing")
    # The spurious-rewards control (arXiv 2506.10947): does the model learn from the reward, or from training
    # at all? The trainer's advantages come from a seeded coin flip per episode; every report stays the posted one.
    random_reward: float = Field(0.0, ge=0.0, lt=1.0, description="above 0: train on a coin flip per episode "
                                 "paying 1 with this probability (seeded by the episode id) instead of its posted "
                                 "reward, the spurious-rewards control; train/reward_mean and held-out rounds still "
                                 "report the posted rewards; 0: off")
    # Where training ends: no step past this one (episodes are still served; 0: no limit). A run
    # stopped from outside at a target step still trained whatever fit between two polls.
    max_steps: int = Field(0, ge=0, description="train no step past this one; 0 = no limit")
    # Held-out rounds at the same steps in every run: the step after a multiple of the clients'
    # cadence (their eval claims' ``eval_every``) waits for that step's round, this long at most.
    eval_hold_s: float = Field(10.0, ge=0, le=3600, description="seconds a step waits for the held-out round "
                               "of the step before it when that step is a multiple of the clients' eval_every")
    # Weight publication: one that takes longer is an error event and the generator restarts on the weights.
    publish_timeout_s: float = Field(600.0, gt=0, le=86400, description="seconds a weight publication to "
                                     "the generator may take before it counts as failed")
    # The generator pool (``swarm worker`` processes joining the server's own generator).
    full_sync_every: int = Field(10, ge=1, le=100_000, description="pool: every this many publications the "
                                 "workers get a full snapshot instead of a delta over the previous version")
    worker_lease_s: float = Field(20.0, gt=0, le=3600, description="pool: a worker that sends no heartbeat "
                                  "for this long is dropped (its calls are re-run elsewhere)")
    disseminate_timeout_s: float = Field(120.0, gt=0, le=3600, description="pool: how long a publication waits "
                                         "for the relay chain; workers it did not reach catch up by heartbeat")
    max_worker_logprob_diff: float | None = Field(None, gt=0, description="pool: drain a worker whose sampled "
                                                  "log-probs differ from the trainer's by more than this; unset: off")

    @classmethod
    def training_fields(cls) -> dict[str, FieldInfo]:
        """Only the inherited ``TrainConfig`` fields configure the update; the rest are the server's."""
        return dict(TrainConfig.model_fields)

    @field_validator("category_ratios")
    @classmethod
    def _ratios_valid(cls, value: dict[str, float]) -> dict[str, float]:
        if any(not (r >= 0) for r in value.values()):
            raise ValueError("category ratios must be non-negative numbers")
        if value and sum(value.values()) <= 0:
            raise ValueError("category ratios must not all be zero")
        return value

    @model_validator(mode="after")
    def _parsers_known(self) -> ServerConfig:
        check_parser_names(self.tool_call_parser, self.reasoning_parser)
        return self

    @model_validator(mode="after")
    def _group_sizes_consistent(self) -> ServerConfig:
        if self.min_group_size > self.group_size:
            raise ValueError(f"min_group_size ({self.min_group_size}) exceeds group_size ({self.group_size})")
        return self

    def patched(self, values: Mapping[str, object]) -> ServerConfig:
        """A validated copy with ``values`` applied; raises ``ValueError`` naming bad keys."""
        unknown = sorted(set(values) - set(type(self).model_fields))
        if unknown:
            raise ValueError(f"unknown config keys: {unknown}; known: {sorted(type(self).model_fields)}")
        # A patch that names a recipe sets its keys afresh (where it sets none of them itself).
        base = self.model_dump(exclude=set(recipe_keys(values["recipe"])) if "recipe" in values else None)
        try:
            return type(self).model_validate({**base, **values})
        except ValidationError as exc:
            raise ValueError(_short_errors(exc)) from None

    @classmethod
    def from_toml(cls, path: str | Path) -> ServerConfig:
        """Load a config file's ``ServerConfig`` keys (``read_config_file``); the engine keys it may
        also hold are the file's ``engine`` part."""
        values = read_config_file(path).values
        return cls().patched(values) if values else cls()


def starting_config(model: str, given: Mapping[str, object]) -> tuple[ServerConfig, ConfigDefaults]:
    """A server's starting config and which defaults it took: the keys ``given`` (by a config file
    and flags, which always win) over the model's defaults (``swarm.defaults.server_defaults``: scaled
    to a pretrained model's size; none for random weights), over ``ServerConfig``'s own."""
    scaled = server_defaults(model)
    taken = {key: value for key, value in scaled.items() if key not in given}
    values = {**taken, **given}
    config = ServerConfig().patched(values) if values else ServerConfig()
    return config, ConfigDefaults(source="model-scaled" if scaled else "built-in", keys=taken)


# Keys a config file may set that choose engines for the process's life (not live-patchable):
# ``engine = "vllm"`` in an experiment's config.toml is how the researcher varies the engine, and
# ``model = "tiny-bpe"`` is how an example names the model it is written for.
ENGINE_KEYS = ("model", "engine", "trainer", "workers", "ray_address", "weight_transfer", "generator_gpus",
               "trainer_gpus", "gpu_memory_utilization", "device", "dtype", "decode_cache", "deterministic",
               "coupled")


# The keys by concern: how ``swarm serve --help`` and ``swarm config`` list them, and the tables a
# config file may group them in. The model stays flat: PATCH /api/v1/config, status and the MLflow
# params name each key alone (a test keeps every field in exactly one section).
SECTIONS: dict[str, tuple[str, ...]] = {
    "optimiser": ("lr", "weight_decay", "grad_clip", "ppo_epochs", "micro_batch_tokens"),
    "lora": ("lora_rank", "lora_alpha", "lora_target_modules"),
    "loss": ("adv_estimator", "norm_adv_by_std", "policy_loss", "loss_agg_mode", "clip_ratio", "clip_ratio_low",
             "clip_ratio_high", "kl_coef", "kl_penalty", "recipe", "rollout_is", "rollout_is_threshold"),
    "batching": ("group_size", "batch_groups", "min_group_size", "batch_mode", "mode", "max_staleness",
                 "admission", "category_ratios", "lease_s", "batch_window_ms", "max_batch_rows"),
    "generation": ("temperature", "top_p", "max_tokens", "client_sampling", "merge_timelines", "tool_call_parser",
                   "reasoning_parser", "chat_template_kwargs"),
    "limits": ("max_prompt_chars", "max_queued_rows", "max_inflight_per_key", "max_episode_tokens",
               "max_event_subscribers"),
    "schedule": ("max_steps", "checkpoint_every", "eval_hold_s", "publish_timeout_s"),
    "storage": ("retention", "retention_export_dir"),
    "rewards": ("random_reward",),
    "pool": ("full_sync_every", "worker_lease_s", "disseminate_timeout_s", "max_worker_logprob_diff"),
    "engines": ENGINE_KEYS,
}


@dataclass(frozen=True)
class ConfigFile:
    """What one config file sets: the engines (fixed for the process) and the live config's keys."""

    engine: dict[str, Any]
    values: dict[str, Any]


def read_config_file(path: str | Path) -> ConfigFile:
    """The one reader of a ``--config`` TOML file. Keys sit at the top level (or under ``[server]``),
    flat, or grouped in tables named by ``SECTIONS`` (``[batching] group_size = 8``); a key in the wrong
    table, or set twice, is an error naming it. Values are validated by their users (``patched``,
    ``ServerSettings``); an unknown flat key is refused there."""
    table = _read_toml(path)
    flat: dict[str, Any] = {}
    for key, value in table.items():
        section = SECTIONS.get(key)
        items = value.items() if section is not None and isinstance(value, dict) else [(key, value)]
        for name, item in items:
            if section is not None and name not in section:
                raise ValueError(f"cannot read config {path}: [{key}] holds no {name!r}; its keys: {list(section)}")
            if name in flat:
                raise ValueError(f"cannot read config {path}: {name!r} is set twice")
            flat[name] = item
    engine = {k: flat.pop(k) for k in ENGINE_KEYS if k in flat}
    return ConfigFile(engine=engine, values=flat)


def engine_choice(path: str | Path) -> dict[str, Any]:
    """The ``ENGINE_KEYS`` a config file sets (command-line flags override them: ``--model`` given >
    the file's ``model`` > ``ServerSettings``' default, ``tiny``)."""
    return read_config_file(path).engine


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from None
    server = data.get("server", data)
    if not isinstance(server, dict):
        raise ValueError(f"cannot read config {path}: [server] must be a table")
    return server


def key_help(key: str) -> tuple[str, Any, str]:
    """A config key's section, default and meaning (its field's description)."""
    field = ServerConfig.model_fields.get(key) or ServerSettings.model_fields[key]
    section = next(name for name, keys in SECTIONS.items() if key in keys)
    default = field.get_default(call_default_factory=True)
    return section, default, field.description or ""


def describe_keys() -> str:
    """Every config key by section, with its default and meaning: ``swarm serve --help``'s epilog and
    ``swarm config --keys``."""
    lines = []
    for section, keys in SECTIONS.items():
        lines.append(f"[{section}]")
        for key in keys:
            _, default, meaning = key_help(key)
            lines.append(f"  {key} = {json.dumps(default, default=str)}  {meaning}")
    return "\n".join(lines)


class ServerSettings(BaseModel):
    """Fixed for the life of a server process; built once by the CLI."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("tiny", min_length=1, description="a preset (tiny, tiny-bpe, ...), a registry model "
                       "(smollm2-135m), a .gguf file, a local model folder or a Hugging Face Hub name "
                       "(org/name or org/name@revision)")
    engine: Literal["torch", "vllm"] = Field("torch", description="the generator: who samples tokens")
    trainer: Literal["torch", "verl"] = Field("torch", description="the trainer: who runs policy updates")
    workers: int = Field(1, ge=1, le=1024, description="verl trainer: FSDP2 workers in the Ray group")
    ray_address: str | None = Field(None, description="verl trainer: an existing Ray cluster (default: start one)")
    vllm_url: str | None = Field(None, description="vllm engine: attach to this running vLLM server")
    vllm_python: str | None = Field(None, description="vllm engine: the Python of the vLLM environment")
    weight_transfer: Literal["auto", "disk", "nccl"] = Field(
        "auto", description="vllm engine: how weights reach vLLM; auto = nccl only where it can work, else disk")
    generator_gpus: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="GPUs (e.g. '3' or '2,3') "
                                       "reserved for the vLLM child; default: the last one")
    trainer_gpus: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="GPUs for verl's Ray workers; "
                                     "default: the ones the generator does not use")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vllm engine: share of each of "
                                                 "its GPUs vLLM takes; default 0.9, or 0.4 on a shared GPU")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="torch engine: auto (the first "
                        "GPU no vLLM child or verl worker was given, else cpu), cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="torch engine: auto = bfloat16 on a "
                                                          "GPU (fp32 master weights and optimizer), float32 on the CPU")
    decode_cache: Literal["auto", "dynamic", "static", "compiled"] = Field(
        "auto", description="torch engine: static = per-row slots in a preallocated KV cache, decode steps replayed "
                            "as CUDA graphs on a GPU; compiled = static with the step fused by torch.compile first; "
                            "dynamic = a growing cache; auto = static on a GPU, else dynamic")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    state_dir: Path = Path("artifacts/swarm")
    token: str | None = None
    client_token: str | None = None  # claims/episodes only (swarm.server.auth)
    worker_token: str | None = None  # pool workers only (swarm.server.auth)
    local_generator: bool = Field(True, description="the server's own generator serves chat calls (else only "
                                  "pool workers do)")
    seed: int = Field(0, description="seeds the model's initialisation (presets) and the sampling noise")
    deterministic: bool = Field(False, description="reproducible runs (sync mode): the same seed and config give "
                                "the same token ids, rewards and step metrics whatever the clients' concurrency or "
                                "arrival order; counter-based sampling noise keyed by (seed, task, sample index, "
                                "position), each keyed row decoded alone (batch-invariant), one batch of groups "
                                "admitted per policy version and each step's samples in claim order; torch engine "
                                "only (swarm.backends.noise)")
    coupled: bool = Field(False, description="paired runs share their sampling noise (common random numbers for "
                          "comparing arms): deterministic mode's keyed noise and step order, but rows decoded in the "
                          "shared batch and the config's own admission (the default's speed and staleness; not "
                          "bit for bit); torch engine only")
    mlflow_uri: str | None = None
    mlflow_run_id: str | None = None
    mlflow_experiment: str = Field("swarm", min_length=1, description="MLflow experiment of a new run")
    max_context: int | None = Field(None, ge=16, description="override the model's context length")
    served_model_name: list[str] | None = Field(None, min_length=1, description="the model names the OpenAI "
                                                "routes answer to (vLLM's --served-model-name): /v1/models lists them "
                                                "and a request naming another model is a 404; unset: the model's own "
                                                "name is listed and a request may name any model")
    disk_reserve_mb: float = Field(64.0, ge=0, description="free space (MiB) kept under the state dir for "
                                   "episodes already running: below it new claims answer 507 (disk full)")
    config: ServerConfig = Field(default_factory=ServerConfig)
    defaults: ConfigDefaults = Field(default_factory=ConfigDefaults, description="which defaults ``config`` "
                                     "took for the keys no file or flag set (``swarm status`` shows them)")


def _short_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
