"""Which arms share their sampling noise (``researcher.study.coupling``): differing torch arms are coupled,
an A/A check and a vLLM arm are not, an arm's own choice wins, and the sentence says which rule applied."""

from __future__ import annotations

from researcher.study.coupling import couple, describe

BASE = {"group_size": 8, "lr": 1e-3, "mode": "sync"}


def test_differing_torch_arms_are_coupled_unless_turned_off() -> None:
    configs = {"a": dict(BASE), "b": {**BASE, "lr": 3e-4}}
    coupled = couple(configs, True)
    assert all(c["coupled"] is True for c in coupled.values()) and "coupled" not in configs["a"]  # a copy
    assert describe(coupled).startswith("Paired arms shared their tasks and sampling noise")
    off = couple(configs, False)
    assert off == configs and "coupling off" in describe(off)


def test_an_aa_check_keeps_independent_noise_and_a_coupled_one_is_called_identical() -> None:
    twins = {"it1-a": dict(BASE), "it1-b": dict(BASE)}
    assert couple(twins, True) == twins
    assert "identical (an A/A check)" in describe(twins)
    forced = {name: {**c, "coupled": True} for name, c in twins.items()}
    assert "identical by construction" in describe(forced)


def test_vllm_arms_and_an_arms_own_choice_are_left_alone() -> None:
    mixed = {"torch": dict(BASE), "vllm": {**BASE, "engine": "vllm"}}
    assert couple(mixed, True) == mixed and "vllm engine draws its own noise" in describe(mixed)
    own = {"a": {**BASE, "deterministic": True}, "b": {**BASE, "deterministic": True, "lr": 3e-4}}
    assert couple(own, True) == own and "deterministic mode" in describe(own)
