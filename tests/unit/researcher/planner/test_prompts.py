"""Prompt templates render with strict variables, and every planner step has one."""

from __future__ import annotations

from pathlib import Path

import pytest

from researcher.planner.prompts import STEPS, PromptError, PromptLibrary, render, variables

PROMPTS = Path(__file__).resolve().parents[4] / "prompts"

# The variables the LLM planner passes for each step (researcher/planner/llm.py).
PASSED = {
    "frame_topic": {"topic", "catalog"},
    "plan_experiments": {"framing", "context"},
    "write_client": {"framing", "example", "experiments", "context"},
    "repair_client": {"code", "error", "example", "context"},
    "decide": {"framing", "context"},
    "write_report": {"framing", "context"},
    "propose_hypotheses": {"goal", "context", "config_keys"},
}


def test_render_rejects_missing_and_extra_variables() -> None:
    assert render("a {{ x }} b {{y}}", {"x": "1", "y": "2"}) == "a 1 b 2"
    with pytest.raises(PromptError, match="missing \\['y'\\]"):
        render("{{ x }} {{ y }}", {"x": "1"})
    with pytest.raises(PromptError, match="unexpected \\['z'\\]"):
        render("{{ x }}", {"x": "1", "z": "2"})


def test_every_step_has_a_template_using_exactly_the_passed_variables() -> None:
    library = PromptLibrary(PROMPTS)
    assert set(STEPS) == set(PASSED)
    for step, names in PASSED.items():
        assert variables(library.templates[step]) == names, step
        text = library.render(step, **{n: f"<{n}>" for n in names})
        assert all(f"<{n}>" in text for n in names)


def test_missing_template_fails_at_load(tmp_path: Path) -> None:
    (tmp_path / "frame_topic.md").write_text("{{ topic }}")
    with pytest.raises(PromptError, match="missing"):
        PromptLibrary(tmp_path)
