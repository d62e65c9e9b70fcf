"""A discovery campaign's goal in words, read into a task and an objective.

"Make the letters task learn faster" names the task; the objective is its held-out reward AUC, per
episode consumed unless the goal says otherwise: "per training step", "per wall-clock second", or "the
final reward after 40 steps". A goal that names no installed task, or asks for something the campaign
cannot measure, is refused with what was understood, so the user can rephrase it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

Objective = Literal["episode", "step", "second", "final"]
SUPPORTED: tuple[Objective, ...] = ("episode", "step")  # judged by a study's verdict axis (seconds and finals: not yet)
_PHRASES: tuple[tuple[Objective, tuple[str, ...]], ...] = (
    ("final", ("final reward", "reward after", "final held-out", "end reward")),
    ("second", ("per second", "per wall-clock", "wall-clock", "wall clock", "per hour", "per minute", "in time")),
    ("step", ("per step", "per training step", "per update", "per iteration")),
    ("episode", ("per episode", "per rollout", "per sample", "sample efficien", "episodes consumed", "per episode")),
)
_WORDS = {"episode": "its held-out reward AUC per episode consumed", "step": "its held-out reward AUC per training step",
          "second": "its held-out reward AUC per wall-clock second", "final": "its final held-out reward"}


class GoalNotMappable(ValueError):
    """The goal names no task or an objective the campaign cannot measure; the message says what was read."""


class Goal(BaseModel):
    text: str
    task: str
    objective: Objective = "episode"
    final_steps: int | None = None  # "the final reward after N steps"

    def describe(self) -> str:
        after = f" after {self.final_steps} steps" if self.final_steps else ""
        return f"the {self.task} task, {_WORDS[self.objective]}{after}"


def read(text: str, tasks: Sequence[str]) -> Goal:
    """The goal ``text`` as a task (one of ``tasks``, named in it) and an objective (per episode by default);
    ``GoalNotMappable`` naming what was understood when it cannot run."""
    lowered = " " + re.sub(r"\s+", " ", text.lower()) + " "
    named = [t for t in tasks if re.search(rf"(?<![a-z0-9_-]){re.escape(t.lower())}(?![a-z0-9_-])", lowered)]
    objective: Objective = next((o for o, phrases in _PHRASES if any(p in lowered for p in phrases)), "episode")
    steps = re.search(r"after (\d+) (?:training )?steps", lowered)
    understood = (f"understood: task {named[0] if len(named) == 1 else ' or '.join(named) or '(none named)'}, "
                  f"objective {_WORDS[objective]}" + (f" after {steps.group(1)} steps" if steps else ""))
    if len(named) != 1:
        which = "names no task" if not named else f"names {len(named)} tasks"
        raise GoalNotMappable(f"the goal {text!r} {which} ({understood}); name one of: {', '.join(tasks)}, e.g. "
                              "\"Make the letters task learn faster per episode consumed\"")
    if objective not in SUPPORTED:
        raise GoalNotMappable(f"the goal {text!r} asks for {_WORDS[objective]} ({understood}); a discovery campaign "
                              f"judges {' or '.join(_WORDS[o] for o in SUPPORTED)} (runs share the CPU cores, so "
                              "wall-clock time is no fair judge here, and a final reward needs a run budget of its own)")
    return Goal(text=text, task=named[0], objective=objective, final_steps=int(steps.group(1)) if steps else None)
