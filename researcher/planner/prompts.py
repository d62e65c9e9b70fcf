"""Prompt templates: one Markdown file per planner step, rendered with strict variables.

A template names its variables as ``{{ name }}``. Rendering fails when the caller leaves a
variable out *or* passes one the template does not use, so prompts and code cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

_VAR = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")

STEPS = ("frame_topic", "plan_experiments", "write_client", "repair_client", "decide", "write_report",
         "propose_hypotheses")


class PromptError(ValueError):
    """A template is missing, or the variables passed do not match the ones it uses."""


def variables(template: str) -> set[str]:
    return set(_VAR.findall(template))


def render(template: str, values: dict[str, str]) -> str:
    wanted, given = variables(template), set(values)
    if wanted != given:
        missing, extra = sorted(wanted - given), sorted(given - wanted)
        raise PromptError(f"prompt variables do not match: missing {missing}, unexpected {extra}")
    return _VAR.sub(lambda m: str(values[m.group(1)]), template)


class PromptLibrary:
    """Loads ``<root>/<step>.md``; a missing step is an error at load time, not mid-study."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.templates: dict[str, str] = {}
        for step in STEPS:
            path = root / f"{step}.md"
            if not path.is_file():
                raise PromptError(f"prompt template {path} is missing")
            self.templates[step] = path.read_text()

    def render(self, step: str, **values: str) -> str:
        if step not in self.templates:
            raise PromptError(f"no prompt for step {step!r}; steps: {list(STEPS)}")
        try:
            return render(self.templates[step], values)
        except PromptError as exc:
            raise PromptError(f"{step}: {exc}") from None
