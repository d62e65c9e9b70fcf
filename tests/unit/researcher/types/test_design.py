"""The study's design types (``researcher.types.design``): plans and framings written by older versions still
load with defaults, new fields are validated, and config values compare as a server reads them."""

from __future__ import annotations

import pytest

from researcher.types.design import Factor, Framing, Plan, same_value


def test_old_plans_and_states_load_with_defaults_and_new_fields_are_validated() -> None:
    old_framing = {"answerable": True, "reason": "r", "question": "q", "task": "letters", "knob": "lr",
                   "metric": "train/reward_mean"}
    framing = Framing.model_validate(old_framing)
    assert (framing.base, framing.factors, framing.example) == ("", [], "letters")
    old_plan = {"rationale": "r", "hypotheses": [{"id": "h1", "statement": "s", "metric": "m", "expected_effect": "e"}],
                "experiments": [{"name": "it1-a", "hypothesis": "h1", "overrides": {"lr": 1e-3}}]}
    plan = Plan.model_validate(old_plan)
    assert (plan.shape, plan.code_change, plan.experiments[0].factors) == ("comparison", "", {})
    new = Framing.model_validate({**old_framing, "task": "vowels", "base": "letters", "knob": "tool",
                                  "factors": [{"name": "tool", "where": "client", "levels": [False, True]}]})
    assert new.example == "letters" and list(new.client_factors()) == ["tool"]
    with pytest.raises(ValueError, match="at least 2 items"):
        Factor(name="tool", where="client", levels=[True])
    with pytest.raises(ValueError, match="should match pattern"):
        Factor(name="no spaces", where="client", levels=[1, 2])


def test_config_values_are_the_same_as_a_server_would_read_them() -> None:
    assert same_value(0.05, 5e-2) and same_value(3, 3.0) and same_value(" Token ", "token")
    assert not same_value(True, 1) and not same_value(False, 0)  # a bool is never a number here
    assert not same_value(1e-3, 1.1e-3) and not same_value("1", 1)
    assert same_value([1, 2], [1, 2]) and same_value(None, None)
