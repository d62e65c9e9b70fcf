"""A plan checked against its framing's design (``researcher.planner.design_check``): a factorial runs every
framed factor where it belongs, at its framed levels, both of each, no combination twice."""

from __future__ import annotations

from researcher.planner import catalog, design_check
from researcher.types.design import Experiment, Factor, Framing, Plan
from swarm.config import ENGINE_KEYS, ServerConfig

FACTORS = [Factor(name="lr", where="server", levels=[1e-3, 3e-3]),
           Factor(name="tool", where="client", levels=[False, True])]


def _plan(*experiments: Experiment, shape: str = "factorial") -> Plan:
    return Plan(rationale="r", shape=shape, experiments=list(experiments),
                hypotheses=[{"id": "h1", "statement": "s", "metric": "m", "expected_effect": "e"}])


def _exp(name: str, lr: float, tool: object) -> Experiment:
    return Experiment(name=name, hypothesis="h1", overrides={"lr": lr}, factors={"tool": tool})


def test_a_factorial_plan_must_run_the_framed_design() -> None:
    framing = Framing(answerable=True, reason="r", question="q", task="letters", knob="lr", factors=FACTORS)
    full = [_exp("a", 1e-3, False), _exp("b", 3e-3, False), _exp("c", 1e-3, True), _exp("d", 3e-3, True)]
    assert design_check.design_complaint(framing, _plan(*full)) is None
    wrong = design_check.design_complaint(framing, _plan(
        _exp("a", 1e-3, False), _exp("b", 1e-3, False), _exp("c", 0.01, False),
        Experiment(name="d", hypothesis="h1", overrides={"lr": 3e-3, "tool": True})))
    assert wrong is not None
    assert "experiments a and b run the same combination of levels" in wrong
    assert "experiment c sets lr = 0.01, not one of its framed levels [0.001, 0.003]" in wrong
    assert "experiment d sets client factor(s) tool in `overrides`" in wrong
    assert "experiment d does not set factor(s) tool" in wrong
    assert "factor tool never runs at level(s) [True]" in wrong
    one = Framing(answerable=True, reason="r", question="q", task="letters", knob="lr", factors=FACTORS[:1])
    assert "needs a framing with two or more factors" in (design_check.design_complaint(one, _plan(*full)) or "")
    assert design_check.design_complaint(one, _plan(*full, shape="comparison")) is None


def test_a_comparison_may_not_put_a_server_key_among_the_client_factors() -> None:
    framing = Framing(answerable=True, reason="r", question="q", task="letters", knob="lr", factors=FACTORS[:1])
    plan = _plan(Experiment(name="a", hypothesis="h1", overrides={}, factors={"lr": 1e-3}),
                 Experiment(name="b", hypothesis="h1", overrides={"lr": 3e-3}), shape="comparison")
    complaint = design_check.design_complaint(framing, plan) or ""
    assert "experiment a sets server config key(s) lr in `factors`: set them in `overrides`" in complaint
    assert "experiment a does not set factor(s) lr" in complaint and "experiment b" not in complaint


def test_the_config_keys_a_plan_is_checked_against_are_the_servers_own() -> None:
    """The researcher may not import the server, so the catalog keeps the list; this keeps it the server's."""
    assert set(catalog.CONFIG_KEYS) == set(ServerConfig.model_fields) | set(ENGINE_KEYS)
