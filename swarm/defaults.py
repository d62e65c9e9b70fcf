"""Training defaults that scale with the model and the data, not with the letters toy.

``training_defaults(model, answer_chars)`` gives the ``ServerConfig`` keys a study on ``model``
should start from, plus the evaluation cadence (``eval_every``, a client setting). The researcher's
data task writes them into its config and client; by hand, ``swarm run --data`` evaluates every 5
steps, the same cadence, and the example configs (gsm-format for SmolLM2) hold the same keys.
``server_defaults(model)`` is what ``swarm serve`` fills in for a pretrained model where no ``--config``
file or flag sets a key: the same values, less ``eval_every``; a tiny preset (or a folder one built)
keeps ``ServerConfig``'s own defaults, which were measured on them.

The rules, and why:
- **Learning rate.** Random tiny presets learn at 1e-3 (measured: letters, arith). Full fine-tuning
  of a pretrained model needs far less, and less the larger it is: 1e-5 up to ~300M parameters
  (SmolLM2-135M learned the answer format at 1e-5 here; 1e-3 wrecks it), 3e-6 to 1.5B, 1e-6 above
  (the range GRPO recipes for 0.5B-7B models use); 3e-6 when the size is unknown (a GGUF file).
- **Completion length**, from the longest reference answer in characters. A pretrained instruct model
  explains before it answers: twice the answer's tokens (~4 characters each) plus 64, at least 96
  (48 cut off most of SmolLM2's replies before their ``####`` line), at most 1024. A tiny preset
  writes the answer alone, a byte a token: the answer plus 2, at least 8 (arith's ``#### 12``).
- **Staleness.** A pretrained model's steps are slow (~40 s for SmolLM2 on 2 CPU cores) and its
  episodes long, so a 96-token episode spans a few steps: ``max_staleness = 4`` (ECHO-2 finds up to
  6 stable). Tiny steps are fast: 1, as the examples use.
- **Micro-batch.** A training forward keeps every layer's activations for the backward pass, about
  1.4 MB a token for SmolLM2-135M in fp32 (30 layers, hidden 576). ``TrainConfig``'s 8192-token
  budget, sized for the tiny presets, put a whole 32-episode batch in one pass: 14.1 GB peak for one
  step (measured), so two such runs side by side (the researcher's ``--parallel 2``) would not fit a
  24 GB machine. 2048 tokens up to ~300M parameters (6.7 GB peak), 1024 to 1.5B, 512 above or when the
  size is unknown; gradients accumulate over micro-batches, so the update itself is the same.
- **Evaluation cadence.** Every 5 steps (``swarm run``'s default): a pretrained model's step is
  slow, so a round every 5 steps still gives a 60-step run 13 points.
- **Waiting for a held-out round.** The step after a round's step waits up to ``eval_hold_s`` for the
  round to be claimed, so every run's rounds fall at the same steps. A client claims it on its next claim
  or refusal, and its workers claim when an episode ends: a tiny preset's episodes end within a second
  (the built-in 10 s), a pretrained model's can take tens of seconds on a CPU. It waits up to 300 s.
"""

from __future__ import annotations

from typing import Any, TypeVar

from swarm.models.named import model_facts

__all__ = ["server_defaults", "training_defaults"]

T = TypeVar("T")
EVAL_HOLD_S = 300.0  # seconds a pretrained model's step waits for its held-out round's claim (the rules above)

_LR_BY_SIZE = ((300_000_000, 1e-5), (1_500_000_000, 3e-6))  # (at most this many parameters, lr); above: 1e-6
_MICRO_BATCH_BY_SIZE = ((300_000_000, 2048), (1_500_000_000, 1024))  # (at most, tokens); above or unknown: 512


def training_defaults(model: str, answer_chars: int = 0) -> dict[str, Any]:
    """ServerConfig keys (``lr``, ``max_tokens``, ``max_staleness``; for a pretrained model also
    ``micro_batch_tokens`` and ``eval_hold_s``) and ``eval_every`` for ``model``
    (a preset, a registry name, a .gguf file or a folder), given the longest reference answer's length."""
    facts = model_facts(model)
    if not facts.pretrained:
        return {"lr": 1e-3, "max_tokens": max(8, answer_chars + 2), "max_staleness": 1, "eval_every": 5}
    size = facts.parameters
    max_tokens = min(1024, max(96, answer_chars // 2 + 64))
    return {"lr": _by_size(_LR_BY_SIZE, size, above=1e-6, unknown=3e-6), "max_tokens": max_tokens,
            "max_staleness": 4, "micro_batch_tokens": _by_size(_MICRO_BATCH_BY_SIZE, size, above=512, unknown=512),
            "eval_hold_s": EVAL_HOLD_S, "eval_every": 5}


def server_defaults(model: str) -> dict[str, Any]:
    """The ``ServerConfig`` keys a server for ``model`` starts from where nothing sets them: empty for a
    model with random weights (``ServerConfig``'s defaults are theirs), else ``training_defaults``'
    server keys (no reference answers known: the shortest completion length)."""
    if not model_facts(model).pretrained:
        return {}
    return {key: value for key, value in training_defaults(model).items() if key != "eval_every"}


def _by_size(table: tuple[tuple[int, T], ...], size: int | None, *, above: T, unknown: T) -> T:
    """The value of the first ``(at most, value)`` row that ``size`` fits; ``above`` past the last row."""
    if size is None:
        return unknown
    return next((value for limit, value in table if size <= limit), above)
