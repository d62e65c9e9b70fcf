"""The example studies' environments and rewards, and the rules every study client follows."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from swarm.client import load_study

EXAMPLES = Path(__file__).resolve().parents[3] / "studies" / "examples"
STUDIES = sorted(p.parent.name for p in EXAMPLES.glob("*/client.py"))
ALLOWED_IMPORTS = {"swarm.client", "openai", "httpx", "__future__"}


def test_the_three_examples_exist() -> None:
    assert {"letters", "digits", "calculator"} <= set(STUDIES)


@pytest.mark.parametrize("name", STUDIES)
def test_study_is_complete_and_imports_only_the_client(name: str) -> None:
    folder = EXAMPLES / name
    assert (folder / "README.md").is_file() and (folder / "config.toml").is_file()
    from swarm.config import ServerConfig

    ServerConfig.from_toml(folder / "config.toml")  # the config a user passes to `swarm serve`
    tree = ast.parse((folder / "client.py").read_text())
    stdlib = set(__import__("sys").stdlib_module_names)
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for module in names:
            top = module.split(".")[0]
            assert top in stdlib or module in ALLOWED_IMPORTS or top in {"openai", "httpx"}, (name, module)
    module = load_study(folder / "client.py")
    first = next(iter(module.tasks(0)))
    assert isinstance(first["task_id"], str)
    assert next(iter(module.tasks(0))) == first  # tasks(seed) is reproducible


def test_letters_reward_counts_a() -> None:
    letters = load_study(EXAMPLES / "letters" / "client.py")
    assert letters.reward("a" * 16) == 1.0
    assert letters.reward("abab" + "c" * 12) == pytest.approx(2 / 16)
    assert letters.reward("") == 0.0


def test_digits_partial_credit() -> None:
    digits = load_study(EXAMPLES / "digits" / "client.py")
    assert digits.reward("4321", "1234") == 1.0
    assert digits.reward("4300", "1234") == 0.5
    assert digits.reward("43210", "1234") == 0.75  # one character too long
    assert digits.reward("", "1234") == 0.0


def test_calculator_tool_parses_calls_and_never_evaluates_code() -> None:
    calc = load_study(EXAMPLES / "calculator" / "client.py")
    assert calc.calc("17+8") == 25 and calc.calc("-7*2") == -14 and calc.calc("3-9") == -6
    assert calc.calc("__import__('os')") is None and calc.calc("2**8") is None
    assert calc.parse_call(calc.call_text("*3")) == "*3"
    assert calc.parse_call("no call here") is None
    assert calc.parse_call("<tool_call>os.system('x')</tool_call>") is None
    examples = calc.warmup_examples(random.Random(0), 20)
    # each example is one turn of a correct trajectory: a call, or the final number
    assert all(e["completion"].startswith("<tool_call>") or e["completion"].lstrip("-").isdigit() for e in examples)
    task = next(calc.tasks(0))
    assert calc.MIN_OPS <= len(task["ops"]) <= calc.MAX_OPS and calc.MIN_OPS + 1 >= 4  # 4+ model calls


def test_calculator_scores_each_skill_on_its_own() -> None:
    calc = load_study(EXAMPLES / "calculator" / "client.py")
    ops = ["+3", "*2"]
    assert calc.score(ops, ["+3", "*2"], "20", 20) == pytest.approx(1.0)
    # a wrong operand costs a quarter of the calls' share; the answer still counts if it repeats the tool
    assert calc.score(ops, ["+3", "*3"], "30", 30) == pytest.approx(0.6 * 0.75 + 0.1 + 0.3)
    # a malformed turn costs the format share; the retried call still counts for its operation
    assert calc.score(ops, [None, "+3", "*2"], "20", 20) == pytest.approx(0.6 + 0.1 * 2 / 3 + 0.3)
    assert calc.score(ops, ["+3", "*2"], None, 20) == pytest.approx(0.7)  # never answered
    assert calc.score(ops, ["-3"], None, 7) == pytest.approx(0.6 * 0.25 + 0.1)
    assert calc.score(ops, [None] * 8, None, 10) == 0.0
    assert not calc.answer_right("None", None) and calc.answer_right(" 12 ", 12)


@pytest.mark.parametrize("name", ["letters", "digits", "calculator"])
def test_example_ships_a_fixed_heldout_set_disjoint_from_its_tasks(name: str) -> None:
    from swarm.client._study import study_heldout

    module = load_study(EXAMPLES / name / "client.py")
    heldout = study_heldout(module)  # validated: dicts with distinct task ids
    assert 16 <= len(heldout) <= 32 and heldout == module.heldout()  # fixed, not drawn per run
    assert module.EVAL_EVERY >= 1

    def content(task: dict) -> str:
        return repr(sorted((k, v) for k, v in task.items() if k != "task_id"))

    held = {content(t) for t in heldout}
    ids = {t["task_id"] for t in heldout}
    for seed in (0, 1, 7):
        stream = module.tasks(seed)
        for _ in range(3000):  # digits has only 1000 numbers: a stream this long meets every one
            task = next(stream)
            assert content(task) not in held and task["task_id"] not in ids, (seed, task)
