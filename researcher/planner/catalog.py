"""What the researcher can study offline: the example tasks and the server's configurable knobs.

``researcher.planner.topic`` reads a topic with these tables (keywords name a knob, aliases name
one of its values, bounds say which numbers can run); the LLM planner gets the same catalog in its
prompt so both planners speak about the same things. Each knob has a ladder of values to sweep
and refine around, a standard first pair, and (where it has one) a reference value: the "off" or
standard setting a "does X help" question compares a single named value against. A knob also names
the metric a claim about it is judged on: the reward unless the claim is about something else
(clip-higher is about entropy, Dr. GRPO about the length of wrong answers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["bool", "int", "float", "choice"]
# The reward: judged on the held-out evaluation where every run has it (researcher.evidence.analysis).
REWARD_METRIC = "train/reward_mean"


@dataclass(frozen=True)
class Knob:
    key: str                      # the flat ServerConfig key (what config.toml sets)
    label: str
    keywords: tuple[str, ...]     # lowercase phrases that name it in a topic
    ladder: tuple[Any, ...]       # ordered candidate values (a sweep's default points)
    first: tuple[Any, ...]        # the first controlled comparison when the topic names no value
    task: str | None = None       # a task this knob only makes sense on
    bounds: tuple[float, float] | None = None  # numeric knobs: the range the researcher runs
    log_scale: bool = False       # numeric knobs spaced by ratios (refine by geometric midpoints)
    reference: Any = None         # the off/standard value; None = the task's configured value
    aliases: tuple[tuple[str, Any], ...] = ()  # lowercase phrases naming one value ("token-level" -> "token")
    metric: str = REWARD_METRIC   # the slash-named step metric a claim on this knob is judged on

    @property
    def kind(self) -> Kind:
        sample = self.ladder[0]
        if isinstance(sample, bool):
            return "bool"
        if isinstance(sample, int):
            return "int"
        return "float" if isinstance(sample, float) else "choice"

    @property
    def on(self) -> Any:
        """The value "with X" means: the first value of the standard pair that is not the reference."""
        return next(v for v in self.first if v != self.reference)

    @property
    def phrases(self) -> tuple[str, ...]:
        """Everything that names the knob: its keywords and its config key (as written or spaced)."""
        return (*self.keywords, self.key, self.key.replace("_", " "))


def show(value: Any) -> str:
    """A knob value as the planners write it in questions and arm names (floats compact: 0.0003, 3e-05)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


KNOBS: tuple[Knob, ...] = (
    Knob("group_size", "GRPO group size", ("group size", "group-size", "groupsize", "samples per prompt",
                                           "rollouts per prompt", "group"),
         (2, 4, 8, 16), (2, 8), bounds=(2, 64), log_scale=True),
    Knob("lr", "learning rate", ("learning rate", "learning-rate", "lr", "step size"),
         (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), (3e-4, 3e-3), bounds=(1e-6, 0.1), log_scale=True),
    Knob("temperature", "sampling temperature", ("temperature", "sampling temp"),
         (0.5, 0.7, 1.0, 1.3), (0.7, 1.3), bounds=(0.1, 2.0)),
    Knob("kl_coef", "KL penalty coefficient", ("kl", "kl coefficient", "kl coef", "kl penalty", "kullback",
                                               "reference penalty"),
         (0.0, 0.01, 0.05, 0.2), (0.0, 0.05), bounds=(0.0, 1.0), reference=0.0),
    Knob("merge_timelines", "timeline merging", ("merging", "merge", "timeline", "timeline merging"),
         (False, True), (False, True), task="calculator", reference=False,
         aliases=(("unmerged", False), ("merged", True))),
    Knob("adv_estimator", "advantage estimator", ("advantage estimator", "advantage", "estimator", "rloo",
                                                  "reinforce"),
         ("grpo", "rloo", "reinforce_plus_plus"), ("grpo", "rloo"), reference="grpo",
         aliases=(("grpo", "grpo"), ("rloo", "rloo"), ("reinforce++", "reinforce_plus_plus"),
                  ("reinforce_plus_plus", "reinforce_plus_plus"), ("reinforce plus plus", "reinforce_plus_plus"))),
    Knob("policy_loss", "policy loss", ("policy loss", "loss function", "loss", "gspo", "cispo", "clipping"),
         ("vanilla", "gspo", "cispo"), ("vanilla", "gspo"), reference="vanilla",
         aliases=(("vanilla", "vanilla"), ("ppo clipping", "vanilla"), ("ppo-clip", "vanilla"), ("gspo", "gspo"),
                  ("cispo", "cispo"))),
    # The DAPO and Dr. GRPO claims: each judged on the metric the paper's claim is about.
    Knob("clip_ratio_high", "PPO upper clip bound (DAPO clip-higher)",
         ("clip-higher", "clip higher", "clip_higher", "upper clip", "upper clipping", "asymmetric clipping",
          "decoupled clipping", "clip ratio high"),
         (0.2, 0.24, 0.28, 0.35), (0.2, 0.28), bounds=(0.05, 1.0), reference=0.2, metric="train/entropy"),
    Knob("batch_mode", "DAPO dynamic sampling (drop groups whose rewards are all equal)",
         ("dynamic sampling", "dapo sampling", "uniform groups", "identical rewards", "zero-advantage groups",
          "varied groups"),
         ("groups", "varied_groups"), ("groups", "varied_groups"), reference="groups",
         aliases=(("dynamic sampling", "varied_groups"), ("varied groups", "varied_groups"),
                  ("varied_groups", "varied_groups"), ("all groups", "groups"))),
    Knob("recipe", "Dr. GRPO (no std normalisation, length-independent loss aggregation)",
         ("dr. grpo", "dr grpo", "drgrpo", "dr_grpo", "dr.grpo", "length bias"),
         ("none", "dr_grpo"), ("none", "dr_grpo"), reference="none", metric="train/response_length_neg_mean",
         aliases=(("dr. grpo", "dr_grpo"), ("dr grpo", "dr_grpo"), ("drgrpo", "dr_grpo"), ("dr_grpo", "dr_grpo"),
                  ("dr.grpo", "dr_grpo"), ("grpo", "none"))),
    # The spurious-rewards control (arXiv 2506.10947): judged on the posted reward, which train/reward_mean
    # keeps reporting while the trainer sees coin flips.
    Knob("random_reward", "random reward (the spurious-rewards control)",
         ("random reward", "random rewards", "spurious reward", "spurious rewards", "coin-flip reward",
          "coin flip reward"),
         (0.0, 0.5), (0.0, 0.5), bounds=(0.0, 0.9), reference=0.0),
    Knob("batch_groups", "batch size (groups per step)", ("batch size", "batch-size", "groups per step"),
         (1, 2, 4, 8), (2, 8), bounds=(1, 32), log_scale=True),
    Knob("max_staleness", "maximum sample staleness (async policy lag)",
         ("staleness", "stale samples", "policy lag", "asynchrony", "off-policy lag"), (0, 1, 2, 4), (0, 2),
         bounds=(0, 16), reference=0),
    Knob("rollout_is", "importance correction of stale samples",
         ("importance correction", "importance sampling", "importance weight", "off-policy correction",
          "rollout correction"), ("off", "token", "sequence"), ("off", "token"), reference="off",
         aliases=(("token-level", "token"), ("token level", "token"), ("per-token", "token"), ("per token", "token"),
                  ("token", "token"), ("sequence-level", "sequence"), ("sequence level", "sequence"),
                  ("per-sequence", "sequence"), ("per sequence", "sequence"), ("sequence", "sequence"),
                  ("seq-level", "sequence"))),
    # Engines (set for a run's life, not live): does serving rollouts from vLLM, or training on verl's
    # FSDP2 workers, change what is learned? Same algorithm, different numerics and timing.
    Knob("engine", "rollout engine (embedded torch sampler vs vLLM)",
         ("vllm", "vllm rollout", "vllm rollouts", "rollout engine", "inference engine", "generation engine"),
         ("torch", "vllm"), ("torch", "vllm"), reference="torch",
         aliases=(("vllm", "vllm"), ("torch", "torch"), ("embedded", "torch"))),
    Knob("trainer", "training engine (embedded torch vs verl FSDP2 workers on Ray)",
         ("verl", "fsdp", "fsdp2", "training engine", "verl trainer"), ("torch", "verl"), ("torch", "verl"),
         reference="torch", aliases=(("verl", "verl"), ("fsdp2", "verl"), ("fsdp", "verl"), ("torch", "torch"),
                                     ("embedded", "torch"))),
)

# Every key a run's config.toml may set: ``ServerConfig``'s fields and the engine keys (``ENGINE_KEYS`` of
# swarm.config), each with its kind. The researcher may not import the server, so this list is kept
# in sync by a test; the server itself validates values (``swarm serve --check``) before any run starts.
CONFIG_KEYS: dict[str, str] = {
    "lr": "float (0, 1], AdamW learning rate", "weight_decay": "float >= 0", "grad_clip": "float > 0",
    "adv_estimator": "str: grpo, rloo, reinforce_plus_plus, ...", "norm_adv_by_std": "bool",
    "policy_loss": "str: vanilla, gspo, cispo, ...",
    "loss_agg_mode": "token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm",
    "clip_ratio": "float (0, 1)", "clip_ratio_low": "float (0, 1), unset: clip_ratio",
    "clip_ratio_high": "float (0, 10], unset: clip_ratio (DAPO clip-higher: 0.28)",
    "recipe": "none | dr_grpo (norm_adv_by_std=false, loss_agg_mode=seq-mean-token-sum-norm)",
    "kl_coef": "float >= 0 (0 disables the reference model)",
    "kl_penalty": "str: low_var_kl, kl, abs, mse",
    "lora_rank": "int 0-1024, LoRA adapter rank (0: full fine-tuning; fixed for the run's life)",
    "lora_alpha": "int >= 1, LoRA scale numerator", "lora_target_modules": "'all-linear' or a list of module names",
    "ppo_epochs": "int 1-16", "micro_batch_tokens": "int >= 64",
    "rollout_is": "off | token | sequence", "rollout_is_threshold": "float > 0",
    "retention": "since_checkpoint | all (episode traces kept after the oldest checkpoint)",
    "retention_export_dir": "str: export pruned episodes there first (relative to the state dir)",
    "random_reward": "float [0, 1): train on a coin flip paying 1 with this probability (0: the posted reward)",
    "group_size": "int 1-1024, GRPO samples per prompt", "batch_groups": "int 1-4096, complete groups per step",
    "min_group_size": "int >= 1, <= group_size",
    "batch_mode": "groups | episodes | varied_groups (DAPO dynamic sampling: groups with all-equal rewards dropped)",
    "mode": "sync | async", "max_staleness": "int 0-64", "temperature": "float 0-4", "top_p": "float (0, 1]",
    "admission": "bool, refuse work that could not finish within max_staleness (429) instead of dropping it",
    "max_tokens": "int >= 1, default completion length", "merge_timelines": "bool", "lease_s": "float (0, 3600]",
    "category_ratios": "table of category -> weight", "batch_window_ms": "float 0-1000",
    "max_batch_rows": "int 1-4096", "max_prompt_chars": "int >= 1", "max_queued_rows": "int 0-65536",
    "max_inflight_per_key": "int 1-4096", "max_episode_tokens": "int >= 1", "max_event_subscribers": "int 1-4096",
    "checkpoint_every": "int >= 0",
    "max_steps": "int >= 0, no training step past it (set by the researcher to each run's step budget)",
    "eval_hold_s": "float >= 0, seconds a step waits for the held-out round of an evaluated step",
    "full_sync_every": "int >= 1, pool: publications between full snapshots to workers (deltas between)",
    "worker_lease_s": "float (0, 3600], pool: a silent worker is dropped after this long",
    "disseminate_timeout_s": "float (0, 3600], pool: how long a publication waits for the relay chain",
    "max_worker_logprob_diff": "float > 0, pool: drain a worker whose log-probs differ more; unset: off",
    "engine": "torch | vllm (rollout engine, set for the run's life)",
    "trainer": "torch | verl (training engine, set for the run's life)",
    "workers": "int >= 1 (verl trainer)", "ray_address": "str (verl trainer)",
    "publish_timeout_s": "float > 0, seconds a weight publication may take before the generator is restarted",
    "weight_transfer": "auto | disk | nccl (vllm engine, set for the run's life)",
    "generator_gpus": "str like '3' or '2,3' (GPUs of the vLLM child)", "trainer_gpus": "str like '0,1' (verl's GPUs)",
    "gpu_memory_utilization": "float (0, 1] (vllm engine)",
    "device": "auto | cpu | cuda | cuda:N (torch engine; auto: the run's GPU, else cpu)",
    "dtype": "auto | float32 | bfloat16 (torch engine; auto: bf16 on a GPU with fp32 master weights)",
    "deterministic": "bool, reproducible sync runs: counter-based sampling noise, rows decoded alone (torch engine)",
    "coupled": "bool, paired runs of one seed share sampling noise (common random numbers), batched decoding (torch engine)",
    "client_sampling": "honor | pin (pin: training calls sample at the config's temperature and top_p)",
    "decode_cache": "auto | static | dynamic | compiled (torch engine; static slots + CUDA graphs, auto: static on a GPU)",
    "model": "str: a preset (tiny, tiny-bpe, tiny-bpe-think) or a local model folder (set for the run's life; "
             "the example's own unless the study was started with --model)",
    "tool_call_parser": "str: hermes, llama3_json, none, auto (how replies become tool_calls)",
    "reasoning_parser": "str: qwen3, deepseek_r1 (<think> text to reasoning_content); unset: none",
    "chat_template_kwargs": "table of chat-template variables every call gets (e.g. enable_thinking)",
}

# "number" is not a digits keyword: "the number of samples per prompt" names no task. The first task
# whose keywords a topic names wins: "tools" (OpenAI-format tool calling) before the calculator, which keeps
# the singular "tool" ("multi-turn tool use", "a scratchpad tool").
TASK_KEYWORDS: dict[str, tuple[str, ...]] = {
    "letters": ("letter", "letters", "'a'", "character"),
    "digits": ("digit", "digits", "reversal", "reverse"),
    "tools": ("tools", "tool task", "tool calling", "tool-calling", "tool call", "tool-call", "function calling",
              "function-calling", "function call", "tiny-bpe", "bpe"),
    "calculator": ("calculator", "tool", "multi-turn", "multi turn", "agent", "arithmetic"),
}
DEFAULT_TASK = "letters"


@dataclass(frozen=True)
class ExampleStudy:
    name: str
    client: Path
    config: Path
    readme: str


def examples(root: Path) -> dict[str, ExampleStudy]:
    """The example studies present on disk (a folder with client.py and config.toml)."""
    found: dict[str, ExampleStudy] = {}
    if not root.is_dir():
        return found
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        client, config = folder / "client.py", folder / "config.toml"
        if client.is_file() and config.is_file():
            readme = folder / "README.md"
            found[folder.name] = ExampleStudy(folder.name, client, config,
                                              readme.read_text()[:2000] if readme.is_file() else "")
    return found


def knob(key: str) -> Knob:
    for item in KNOBS:
        if item.key == key:
            return item
    raise KeyError(f"unknown knob {key!r}; known: {[k.key for k in KNOBS]}")


def describe(root: Path) -> str:
    """A human- and LLM-readable list of what can be studied."""
    tasks = ", ".join(sorted(examples(root))) or "(no example studies found)"
    lines = [f"Tasks (example studies): {tasks}.",
             "Knobs (server config keys), the values a sweep tries, the range that can run and the off/standard value:"]
    for item in KNOBS:
        only = f" (task {item.task} only)" if item.task else ""
        bounds = f"; range {item.bounds[0]:g} to {item.bounds[1]:g}" if item.bounds else ""
        reference = f"; off/standard {item.reference!r}" if item.reference is not None else ""
        judged = f"; judged on `{item.metric}`" if item.metric != REWARD_METRIC else ""
        lines.append(f"- {item.label}: `{item.key}` in {list(item.ladder)}{bounds}{reference}{judged}{only}")
    return "\n".join(lines)


def describe_config_keys() -> str:
    """Every server config key with its kind: what the LLM planner may set beyond the catalog's knobs."""
    return "\n".join(f"- `{key}`: {kind}" for key, kind in CONFIG_KEYS.items())
