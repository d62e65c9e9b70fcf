"""The axes a learning curve is measured on, their words, the axis a knob's verdict is judged on, the
axes a knob offers, and the reward metrics a hypothesis registers.

A leaf module (no imports): the evidence, the report and the planners word the axes the same way.
"""

from __future__ import annotations

TRAIN_METRIC = "train/reward_mean"  # the sampled training batch's reward: a point every step
EVAL_METRIC = "eval/reward_mean"  # held-out evaluation, every few steps: what the example studies register
REWARD_METRICS = (TRAIN_METRIC, EVAL_METRIC)  # the task's reward; a claim may be judged on another (entropy, lengths)
AXES = ("step", "episode", "second", "token")
AXIS_TEXT = {"step": "per training step", "episode": "per episode consumed", "second": "per wall-clock second",
             "token": "per generated token"}
AXIS_UNIT = {"step": "steps", "episode": "episodes", "second": "s", "token": "tokens"}
TOKENS_METRIC = "context/generated_tokens"  # tokens a step's batch generated: the token axis accumulates them
# Knobs that change how many tokens an episode generates: per generated token is offered beside the others
# (a secondary axis: a longer limit spends more of the budget a step whether or not it learns more).
_PER_TOKEN = {"max_tokens"}
# Knobs that change how many episodes a training step consumes: judged per episode, since per step the
# larger setting trivially sees more samples.
_PER_EPISODE = {"group_size": "a larger group sees more samples per training step",
                "batch_groups": "a larger batch sees more samples per training step"}


def primary_axis(knob: str) -> tuple[str, str]:
    """The axis a knob's verdict is judged on, and why (wall-clock is never primary: runs share 2 CPU
    cores, so seconds measure contention as much as learning)."""
    if knob in _PER_EPISODE:
        return "episode", f"judged per episode consumed, not per training step: {_PER_EPISODE[knob]}"
    return "step", ("judged per training step (every configuration trains on the same number of episodes per "
                    "step); per wall-clock second is shown but not judged, since runs share the CPU cores")


def offered_axes(knob: str) -> tuple[str, ...]:
    """The axes a study of ``knob`` measures: step, episode and second always; per generated token where
    the knob changes the tokens an episode generates."""
    return AXES if knob in _PER_TOKEN else tuple(a for a in AXES if a != "token")
