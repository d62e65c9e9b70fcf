"""What the researcher can study offline: the example tasks and the server's configurable knobs.

The offline planner maps a topic onto one task and one knob with these keyword tables; the LLM
planner gets the same catalog in its prompt so both planners speak about the same things. Each
knob has a ladder of values to compare and to refine around (successive halving walks the ladder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Knob:
    key: str                      # the flat ServerConfig key (what config.toml sets)
    label: str
    keywords: tuple[str, ...]     # lowercase phrases that name it in a topic
    ladder: tuple[Any, ...]       # ordered candidate values
    first: tuple[Any, ...]        # the first controlled comparison
    task: str | None = None       # a task this knob only makes sense on


KNOBS: tuple[Knob, ...] = (
    Knob("group_size", "GRPO group size", ("group size", "group-size", "groupsize", "samples per prompt",
                                           "rollouts per prompt", "group"),
         (2, 4, 8, 16), (2, 8)),
    Knob("lr", "learning rate", ("learning rate", "learning-rate", "lr", "step size"),
         (1e-4, 3e-4, 1e-3, 3e-3, 1e-2), (3e-4, 3e-3)),
    Knob("temperature", "sampling temperature", ("temperature", "sampling temp"),
         (0.5, 0.7, 1.0, 1.3), (0.7, 1.3)),
    Knob("kl_coef", "KL penalty coefficient", ("kl", "kullback", "reference penalty"),
         (0.0, 0.01, 0.05, 0.2), (0.0, 0.05)),
    Knob("merge_timelines", "timeline merging", ("merging", "merge", "timeline"),
         (False, True), (False, True), task="calculator"),
    Knob("adv_estimator", "advantage estimator", ("advantage estimator", "advantage", "estimator", "rloo",
                                                  "reinforce"),
         ("grpo", "rloo", "reinforce_plus_plus"), ("grpo", "rloo")),
    Knob("policy_loss", "policy loss", ("policy loss", "loss function", "loss", "gspo", "cispo", "clipping"),
         ("vanilla", "gspo", "cispo"), ("vanilla", "gspo")),
    Knob("batch_groups", "batch size (groups per step)", ("batch size", "batch-size", "groups per step"),
         (1, 2, 4, 8), (2, 8)),
    Knob("max_staleness", "maximum sample staleness (async policy lag)",
         ("staleness", "stale samples", "policy lag", "asynchrony", "off-policy lag"), (0, 1, 2, 4), (0, 2)),
    Knob("rollout_is", "importance correction of stale samples",
         ("importance correction", "importance sampling", "importance weight", "off-policy correction",
          "rollout correction"), ("off", "token", "sequence"), ("off", "token")),
    # Engines (set for a run's life, not live): does serving rollouts from vLLM, or training on verl's
    # FSDP2 workers, change what is learned? Same algorithm, different numerics and timing.
    Knob("engine", "rollout engine (embedded torch sampler vs vLLM)",
         ("vllm", "vllm rollout", "vllm rollouts", "rollout engine", "inference engine", "generation engine"),
         ("torch", "vllm"), ("torch", "vllm")),
    Knob("trainer", "training engine (embedded torch vs verl FSDP2 workers on Ray)",
         ("verl", "fsdp", "fsdp2", "training engine", "verl trainer"), ("torch", "verl"), ("torch", "verl")),
)

TASK_KEYWORDS: dict[str, tuple[str, ...]] = {
    "letters": ("letter", "letters", "'a'", "character"),
    "digits": ("digit", "digits", "reversal", "reverse", "number"),
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
    lines = [f"Tasks (example studies): {tasks}.", "Knobs (server config keys) and the values tried:"]
    for item in KNOBS:
        only = f" (task {item.task} only)" if item.task else ""
        lines.append(f"- {item.label}: `{item.key}` in {list(item.ladder)}{only}")
    return "\n".join(lines)
