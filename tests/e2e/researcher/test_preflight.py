"""New study code is checked before it trains (issue 17), through the real validate node.

Every check runs for real: the static contract reads the source, the data probe is a boxed
``swarm run --probe`` process, and the smoke runs are boxed ``swarm run --rewards-out`` processes
against one real tiny server. Each failure must reach ``validation["error"]`` (what the repair step
sees) with the precise verdict on its first line, and stop the client before any training run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from researcher.findings.records import IterationPlan
from researcher.planner.offline import OfflinePlanner
from researcher.runs import preflight
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.session.nodes import validate
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings
from swarm.client import RewardRecord

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "studies" / "examples"
LETTERS = EXAMPLES / "letters"

# A planner-written client for a task no example has (count the vowels of a word), in the shape the
# LLM planner writes: tasks from random.Random(seed), a held-out set from its own stream, a partial
# reward. The tests derive broken variants from it by replacing one line.
VOWELS = '''
"""Vowels: the model answers a word; the reward is a partial credit on its reply."""
import random

from swarm.client import EpisodeHandle, run_study_cli

GROUP_SIZE = 4
REWARD_RANGE = (0.0, 1.0)


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnop") for _ in range(6))


def heldout() -> list[dict]:
    rng = random.Random("vowels-heldout")
    return [{"task_id": f"vowels-heldout-{i}", "word": _word(rng)} for i in range(4)]


def tasks(seed: int):
    rng = random.Random(seed)
    held = {task["word"] for task in heldout()}
    index = 0
    while True:
        word = _word(rng)
        if word not in held:
            yield {"task_id": f"vowels-{seed}-{index}", "word": word}
            index += 1


def reward(text: str, task: dict) -> float:
    return (sum(map(ord, text)) % 11) / 10  # spreads over [0, 1] for almost any two different replies


def workflow(ep: EpisodeHandle, task: dict) -> float:
    reply = ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": task["word"]}],
                                                max_tokens=8, temperature=1.0)
    return reward(reply.choices[0].message.content or "", task)


if __name__ == "__main__":
    run_study_cli(__file__)
'''
REWARD_LINE = "    return (sum(map(ord, text)) % 11) / 10  # spreads over [0, 1] for almost any two different replies"


def _variant(old: str, new: str) -> str:
    assert VOWELS.count(old) == 1, old
    return VOWELS.replace(old, new)


def _context(tmp_path: Path, study_id: str, server: tuple[str, str] | None = None) -> StudyContext:
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, servers=[server[0]] if server else [],
                                  server_token=server[1] if server else None).resolved()
    return StudyContext(settings=settings, layout=StudyLayout(study_id, settings.studies_root, settings.artifacts_root),
                        planner=OfflinePlanner(["letters"]),
                        tracker=Tracker(settings.mlflow_uri(), settings.mlflow_artifact_root()),
                        launcher=Launcher(settings.swarm_command, external_token=settings.server_token))


def _validate(ctx: StudyContext, source: str) -> dict:
    plan = IterationPlan.model_validate({"experiments": [{"name": "e1", "hypothesis": "h1", "overrides": {}}]})
    studyfiles.write_plan(ctx.layout, 1, plan, {})
    studyfiles.write_experiment(ctx.layout, "e1", source, dict(group_size=4), "h1")
    state = {"iteration": 1, "options": {"smoke_episodes": 4, "smoke_timeout_s": 120.0},
             "budget": {"max_repairs": 3}, "validation": None}
    return validate.validate(state, ctx)  # type: ignore[arg-type]


def _failed(result: dict) -> str:
    assert result["phase"] == "writing" and result["validation"]["ok"] is False, result  # back to repair
    return result["validation"]["error"]


def test_contract_and_probe_failures_reach_repair_before_anything_trains(tmp_path: Path) -> None:
    cases = {
        "no-range": (_variant("REWARD_RANGE = (0.0, 1.0)\n", ""),
                     "client.py does not declare REWARD_RANGE: add a module-level `REWARD_RANGE = (low, high)`"),
        "nondeterministic": (_variant("    rng = random.Random(seed)\n", "    rng = random.Random()\n"),
                             "tasks(0) is not deterministic: called twice, its task 0 was {"),
        "overlapping": (_variant('    rng = random.Random("vowels-heldout")', "    rng = random.Random(0)")
                        .replace("        if word not in held:\n", "        if True:\n"),
                        "heldout() overlaps the training tasks: 4 of 600 tasks (the first 200 of seeds 0, 1, 2) are "
                        'held-out tasks (task ids aside), e.g. {"task_id": "vowels-0-0", "word": '),
    }
    for study_id, (source, verdict) in cases.items():
        ctx = _context(tmp_path, study_id)

        error = _failed(_validate(ctx, source))

        assert error.splitlines()[0].startswith(verdict), (study_id, error)
        smoke_dir = ctx.layout.smoke_dir(1, 1)
        assert not (smoke_dir / "server").exists() and not (smoke_dir / preflight.REWARDS_FILE).exists()
        log = ctx.layout.log_md.read_text()
        assert f"Validation attempt 1 FAILED: {verdict[:60]}" in log, log
        passed = "passed: compiled, import check" + (", static contract)" if study_id != "no-range" else ")")
        assert passed in log, log
        if study_id != "no-range":  # the probe ran boxed and kept its output
            assert json.loads((smoke_dir / preflight.PROBE_LOG).read_text().splitlines()[-1])["problems"]

    # The contract reads REWARD_RANGE from the source: a literal pair of finite numbers, low < high.
    for bad, why in (("(1, 0)", "low and high must be finite with low < high"), ("(0, 1e999)", "must be finite"),
                     ("(0, 1, 2)", "must be a pair of numbers"), ("(0, True)", "must be a pair of numbers"),
                     ("(0, HIGH)", "must be a literal pair of numbers like (0.0, 1.0), not `(0, HIGH)`")):
        failure = preflight.check_contract(_variant("REWARD_RANGE = (0.0, 1.0)", f"REWARD_RANGE = {bad}"), "client.py")
        assert isinstance(failure, preflight.Failure) and why in failure.message, (bad, failure)
    missing = preflight.check_contract(_variant("def heldout()", "def held_out()"), "client.py")
    assert isinstance(missing, preflight.Failure) and missing.message.startswith("client.py does not define heldout()")
    for example in EXAMPLES.glob("*/client.py"):  # every example declares its range
        assert preflight.check_contract(example.read_text(), "client.py") == (0.0, 1.0), example


def test_reward_checks_on_records() -> None:
    """The verdicts on reward lines, including a group that is constant at a value other than zero."""
    def records(*groups: list[float]) -> list[RewardRecord]:
        return [RewardRecord(task_id=f"t{g}", group=f"t{g}:x", purpose="train", reward=r)
                for g, rewards in enumerate(groups) for r in rewards]

    assert preflight.check_variation(records([0.0] * 4, [0.0, 0.0, 0.25, 0.0])) is None
    two_levels = preflight.check_variation(records([0.0] * 4, [1.0] * 4))
    assert two_levels is not None and two_levels.message.startswith(
        "a reward constant within each of the 2 groups (0, 1) in all 8 episodes of the smoke run: GRPO's advantages")
    nothing = preflight.check_variation(records([0.5]))
    assert nothing is not None and "finished no GRPO group of 2 or more episodes" in nothing.message
    raised = [RewardRecord(task_id="t", group="g", purpose="eval", reward=None, error="KeyError: 'word'")]
    failure = preflight.check_rewards(records([0.5] * 3) + raised, (0.0, 1.0))
    assert failure is not None and failure.message == (
        "1 of 4 smoke episodes produced no reward; the first (task t, eval): KeyError: 'word'")
    assert preflight.smoke_size(4) == (8, 4) and preflight.smoke_size(10) == (12, 4)


@pytest.mark.slow
def test_smoke_reward_checks_catch_constant_and_out_of_range_rewards(tmp_path: Path, swarm_server) -> None:
    """Against one real tiny server: a constant reward and rewards outside the declared range (1.5
    and a NaN the server refuses) fail with their verdicts; a planner-written client with a varying
    reward and the letters example unchanged (exempt from the constant check) pass."""
    constant = _variant(REWARD_LINE, "    return 0.5")
    out_of_range = _variant(REWARD_LINE, '    return float("nan") if task["task_id"].endswith("-1") else 1.5')

    error = _failed(_validate(_context(tmp_path, "constant", swarm_server), constant))
    assert error.splitlines()[0] == (
        "constant reward 0.5 in all 8 episodes / 2 groups of the smoke run: GRPO's advantages are all zero, so it "
        "learns nothing; adapt the task or the reward, e.g. partial credit, or an easier task level the untrained "
        "model sometimes solves"), error

    ctx = _context(tmp_path, "range", swarm_server)
    error = _failed(_validate(ctx, out_of_range))
    first = error.splitlines()[0]
    # 8 training episodes (2 groups of 4) and 4 held-out ones; task "-1" returns NaN (4 train + 1 eval).
    assert first.startswith("12 of 12 smoke episodes returned a reward outside REWARD_RANGE = (0, 1): 1.5 (7 "
                            "episodes), nan (5 episodes); a NaN or infinite reward is refused by the server"), error
    assert "task vowels-0-1 (train): reward nan" in error
    rewards = preflight.read_rewards(ctx.layout.smoke_dir(1, 1) / preflight.REWARDS_FILE)
    assert {r.purpose for r in rewards} == {"train", "eval"} and len({r.group for r in rewards if
                                                                      r.purpose == "train"}) == 2

    ctx = _context(tmp_path, "vowels", swarm_server)
    assert _validate(ctx, VOWELS)["validation"] == {"attempts": 1, "ok": True, "error": None}
    log = ctx.layout.log_md.read_text()
    assert ("passed: compiled; import check; static contract (REWARD_RANGE = (0, 1)); data probe (tasks(seed) "
            "deterministic and seed-dependent over the first 200 tasks of seeds 0, 1, 2; 4 held-out tasks, disjoint); "
            "smoke run (8 episodes in groups of 4 on a real server); reward checks (inside REWARD_RANGE: 12 rewards "
            "in [") in log, log
    # The observed range depends on what the sampled tiny model spells (0.2 when no episode scored 0).
    assert re.search(r"12 rewards in \[[0-9.]+, [0-9.]+\]; varying within 2 of 2 training groups\)\.", log), log
    assert "exempt" not in log

    ctx = _context(tmp_path, "letters", swarm_server)
    assert _validate(ctx, (LETTERS / "client.py").read_text())["validation"]["ok"] is True
    assert "the letters example unchanged, exempt from the constant-reward check" in ctx.layout.log_md.read_text()
