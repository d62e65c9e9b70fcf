"""Factorial designs: client factor levels written into client.py, old plans and states still load, and
main effects and interactions recovered with their intervals from
hand-made learning curves (real metrics.jsonl files scored by ``researcher.evidence.analysis``)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from evidence_inputs import evidence

from researcher.evidence import factorial, stats
from researcher.findings import verdicts
from researcher.findings.records import Arm, Evidence, IterationSummary, PlannedExperiment
from researcher.runs import record as runs
from researcher.study import files as studyfiles
from researcher.types.design import Factor
from swarm.protocol import StepMetrics

CLIENT = '''"""A client with factors."""
GREETING = "héllo"  # non-ASCII before the assignment: offsets are bytes
FACTORS: dict = {"tool": True, "prompt": "plain",
                 "reward": "partial"}  # the defaults


def workflow(ep, task):
    return 1.0 if FACTORS["tool"] else 0.0
'''
STEPS = 10
OFFSETS = (-0.02, -0.01, 0.01, 0.02)  # per-seed shifts, mean 0: the estimates are exact
FACTORS = [Factor(name="lr", where="server", levels=[1e-3, 3e-3]),
           Factor(name="tool", where="client", levels=[False, True])]


def test_set_factors_rewrites_only_the_factors_assignment() -> None:
    out = studyfiles.set_factors(CLIENT, {"tool": False, "prompt": "hint ü"})
    assert out == CLIENT.replace('{"tool": True, "prompt": "plain",\n                 "reward": "partial"}',
                                 "{'tool': False, 'prompt': 'hint ü', 'reward': 'partial'}")
    namespace: dict = {}
    exec(compile(out, "client.py", "exec"), namespace)  # the rewritten file runs, with the new levels
    assert namespace["FACTORS"] == {"tool": False, "prompt": "hint ü", "reward": "partial"}
    assert namespace["workflow"](None, None) == 0.0
    assert studyfiles.set_factors(CLIENT, {}) is CLIENT  # no levels: the file as is
    assert studyfiles.set_factors("x = 1\n", {}) == "x = 1\n"  # a client without factors needs none

    with pytest.raises(ValueError, match=r"sets client factor\(s\) tool, but the client has no top-level `FACTORS"):
        studyfiles.set_factors("def workflow(ep, task):\n    FACTORS = {'tool': 1}\n", {"tool": True})
    with pytest.raises(ValueError, match=r"client factor\(s\) scratchpad that the client's FACTORS does not declare "
                                         r"\(it declares: tool, prompt, reward\)"):
        studyfiles.set_factors(CLIENT, {"scratchpad": True})
    with pytest.raises(ValueError, match="is not a dict literal"):
        studyfiles.set_factors("FACTORS = dict(tool=True)\n", {"tool": False})
    with pytest.raises(ValueError, match="assigns FACTORS 2 times"):
        studyfiles.set_factors("FACTORS = {'a': 1}\nFACTORS = {'a': 2}\n", {"a": 3})


def _trials(tmp: Path, cells: dict[tuple[float, bool], float], seeds: int = len(OFFSETS)) -> list[dict]:
    """Flat reward curves (AUC = their height) at ``cells[(lr, tool)]`` plus each seed's offset."""
    trials = []
    for (lr, tool), height in cells.items():
        name = f"lr{lr:g}-tool{tool}"
        for seed, offset in enumerate(OFFSETS[:seeds]):
            run_dir = tmp / f"{name}-{seed}"
            run_dir.mkdir(parents=True)
            runs.append_metrics(run_dir, [StepMetrics(step=s, policy_version=s, time=1_700_000_000 + s, metrics={
                "train/reward_mean": height + offset, "train/episodes": 32.0}) for s in range(1, STEPS + 1)])
            exp = PlannedExperiment(name=name, overrides={"lr": lr}, factors={"tool": tool})
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished",
                           "iteration": 1, "overrides": exp.settings})
    return trials


def test_main_effects_and_interaction_are_recovered_with_welch_satterthwaite_intervals(tmp_path: Path) -> None:
    # lr main effect (0.40+0.70)/2 − (0.20+0.30)/2 = 0.30; tool (0.30+0.70)/2 − (0.20+0.40)/2 = 0.20;
    # interaction (0.20+0.70)/2 − (0.40+0.30)/2 = 0.10.
    cells = {(1e-3, False): 0.20, (3e-3, False): 0.40, (1e-3, True): 0.30, (3e-3, True): 0.70}
    study = evidence("lr", "train/reward_mean", STEPS, _trials(tmp_path / "a", cells), 0.02, "factorial")
    study.effects = factorial.effects(study, FACTORS)
    got = {e.name: e for e in study.effects}
    assert [e.kind for e in study.effects] == ["main", "main", "interaction"]
    # By hand: each arm's s² = var(OFFSETS), n = 4, weights ±1/2: var = 4 · ¼ · s²/4, df = 12.
    s2 = sum(o * o for o in OFFSETS) / 3
    hw = stats.t975(12) * math.sqrt(s2 / 4)
    for name, truth in (("lr", 0.30), ("tool", 0.20), ("lr×tool", 0.10)):
        assert got[name].estimate == pytest.approx(truth, abs=1e-9)
        assert got[name].hw == pytest.approx(hw, rel=1e-6) and got[name].df == pytest.approx(12)
        assert got[name].resolved and got[name].aliases == [] and got[name].arms == 4
    assert study.axis == "step"

    section = "\n".join(factorial.effects_section(study))
    assert "## Effects" in section and "| effect | estimate | 95% CI | resolved? |" in section
    assert f"| tool (False → True) | +0.200 | [{0.2 - hw:+.3f}, {0.2 + hw:+.3f}] | yes: the CI excludes 0 |" in section
    assert "| lr×tool (interaction) | +0.100 |" in section
    # A factorial is not a dose-response curve; its answer is its effects, resolved ones first.
    assert not study.sweep
    answer, _ = verdicts.verdict("q", [IterationSummary(iteration=1, knob="lr", best=study.best, study=study)])
    assert answer.startswith("Resolved: lr, tool, lr×tool (their 95% CIs exclude 0 and their estimates exceed "
                             f"±{study.min_effect}) — factorial effects on the "
                             "area under the `train/reward_mean` curve per training step: lr +0.300 (95% CI "), answer
    values = factorial.mlflow_values(study)
    assert values["analysis/effect/lr"] == pytest.approx(0.30) and values["analysis/effect/lr_x_tool"] == pytest.approx(0.1)
    assert values["analysis/effect_ci/tool"] == pytest.approx(hw)

    # No interaction: the estimate is 0 and its interval says so (not resolved); one seed: no interval.
    additive = {(1e-3, False): 0.20, (3e-3, False): 0.40, (1e-3, True): 0.30, (3e-3, True): 0.50}
    study = evidence("lr", "train/reward_mean", STEPS, _trials(tmp_path / "b", additive), 0.02, "factorial")
    inter = factorial.effects(study, FACTORS)[2]
    assert inter.estimate == pytest.approx(0.0, abs=1e-9) and inter.low < 0 < inter.high
    assert not inter.resolved
    study = evidence("lr", "train/reward_mean", STEPS, _trials(tmp_path / "c", cells, seeds=1), 0.02)
    study.effects = factorial.effects(study, FACTORS)
    assert study.effects[0].hw is None and study.effects[0].estimate == pytest.approx(0.30)
    assert "n/a (needs ≥ 2 seeds per arm)" in "\n".join(factorial.effects_section(study))
    assert "analysis/effect_ci/lr" not in factorial.mlflow_values(study)


def test_a_half_fraction_reports_its_aliases() -> None:
    """2^(3-1) with C = A·B: each main effect shares its contrast with the other two factors' interaction."""
    design = [Factor(name=n, where="client", levels=[0, 1]) for n in ("a", "b", "c")]
    arms = [{"overrides": {"a": a, "b": b, "c": int(a == b)}, "scores": {"step": [v, v + 0.01]}}
            for (a, b), v in {(0, 0): 0.1, (1, 0): 0.3, (0, 1): 0.2, (1, 1): 0.6}.items()]
    study = Evidence(knob="a", metric="train/reward_mean", axis="step",
                     arms=[Arm(name=f"arm{i}", **arm) for i, arm in enumerate(arms)])
    got = {e.name: e for e in factorial.effects(study, design)}
    assert got["a"].aliases == ["b×c"] and got["c"].aliases == ["a×b"] and got["a×b"].aliases == ["c"]
    assert got["a"].estimate == pytest.approx((0.3 + 0.6) / 2 - (0.1 + 0.2) / 2)
    assert ast.literal_eval(repr(got["a"].levels)) == [[0, 1]]
