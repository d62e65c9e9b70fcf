"""Open framing with an LLM planner: new tasks on an example's base, any server config key, factors;
config keys and values validated by the server's own code before anything launches; each
experiment folder's client carrying its factor levels.

The LLM is a real OpenAI-protocol server on loopback with scripted answers (``scripted_llm``), the
planner the real ``LLMPlanner``, the config check a real ``swarm serve --check`` process. The client
writing node runs with the real offline planner (whose client is the code it is given), so no MLflow
store is needed.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from support.scripted_llm import ScriptedLLM

from researcher.findings.records import IterationPlan
from researcher.planner import catalog, topic
from researcher.planner.llm import LLMPlanner
from researcher.planner.offline import OfflinePlanner
from researcher.planner.prompts import PromptLibrary
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.session.nodes import frame_topic, plan_experiments, write_client
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.design import Framing
from researcher.types.settings import LLMSettings, ResearcherSettings, StudyOptions
from researcher.types.usage import new_usage
from swarm.client import load_study

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "studies" / "examples"
LETTERS = EXAMPLES / "letters"
TOPIC = "Does a scratchpad tool help the agent count vowels, and does that depend on the learning rate?"
FRAMING = {"answerable": True, "reason": "a new task on the letters base", "question": "tool × lr on vowels",
           "task": "vowels", "base": "letters", "knob": "tool", "metric": "train/reward_mean",
           "factors": [{"name": "tool", "where": "client", "levels": [False, True]},
                       {"name": "lr", "where": "server", "levels": [1e-3, 3e-3]}]}


def _framing(**changes: Any) -> Framing:
    return Framing.model_validate({**FRAMING, **changes})


def test_open_framings_are_checked_against_the_examples_config_keys_and_the_topic() -> None:
    examples = catalog.examples(EXAMPLES)
    assert frame_topic.framing_problem(_framing(), examples) is None
    assert frame_topic.framing_problem(_framing(factors=[], knob="max_tokens", task="letters", base=""), examples) is None
    cases = {"base 'sudoku' is not an example study": _framing(base="sudoku"),
             "task 'digits' is another example than base 'letters'": _framing(task="digits"),
             "server factor 'group_sise' is not a server config key": _framing(
                 knob="group_sise", factors=[{"name": "group_sise", "where": "server", "levels": [2, 8]}]),
             "client factor 'lr' has the name of a server config key": _framing(
                 knob="lr", factors=[{"name": "lr", "where": "client", "levels": [1, 2]}]),
             "factor 'tool' repeats a level": _framing(factors=[{"name": "tool", "where": "client", "levels": [1, 1.0]}]),
             "knob 'temperature' is not one of the factors (tool, lr)": _framing(knob="temperature"),
             "knob 'scratchpad' is not a server config key; a client-side knob is declared in `factors`": _framing(
                 factors=[], knob="scratchpad")}
    for expected, framing in cases.items():
        assert expected in (frame_topic.framing_problem(framing, examples) or ""), expected
    # The topic's keyword reading ("tool", "agent": the calculator example) binds an example task, not a new one.
    question = topic.parse(TOPIC)
    assert (question.task, question.knob) == ("calculator", "lr")
    assert frame_topic.topic_complaint(question, _framing(), examples) is None
    complaint = frame_topic.topic_complaint(question, _framing(task="letters", base=""), examples)
    assert complaint is not None and "frame it on `calculator`" in complaint


def _plan(temperature: float | None = None, typo: bool = False) -> dict[str, Any]:
    experiments = []
    for tool in (False, True):
        for lr in (1e-3, 3e-3):
            overrides: dict[str, Any] = {"lr": lr}
            if typo and tool and lr == 3e-3:
                overrides["group_sise"] = 4
            if temperature is not None and not tool and lr == 1e-3:
                overrides["temperature"] = temperature
            experiments.append({"name": f"it1-tool{int(tool)}-lr{lr * 1e3:.0f}", "hypothesis": "h1", "overrides": overrides,
                                "factors": {"tool": tool}})
    return {"rationale": "2x2", "shape": "factorial", "experiments": experiments,
            "hypotheses": [{"id": "h1", "statement": "the tool helps", "metric": "train/reward_mean",
                            "expected_effect": "higher AUC with the tool"}]}


def test_unknown_config_key_is_refused_before_launch_and_repaired() -> None:
    script = {"frame the research topic": [FRAMING],
              "plan the experiments": [_plan(temperature=9.0, typo=True), _plan()]}
    settings = ResearcherSettings()
    check = plan_experiments.config_check(settings.swarm_command, LETTERS / "config.toml")
    question = topic.parse(TOPIC)
    context = {"iteration": 1, "topic": TOPIC, "named": question.summary(), "tested_values": [], "runs_left": 16,
               "seeds_per_experiment": 2, "config_keys": catalog.CONFIG_KEYS}
    with ScriptedLLM(script) as llm:
        planner = LLMPlanner(LLMSettings(base_url=llm.url, model="scripted", max_retries=0),
                             PromptLibrary(REPO / "prompts"))
        framing = planner.frame(TOPIC, catalog.describe(EXAMPLES)).value  # the new-task framing parses as is
        assert framing.factors[0].where == "client" and framing.example == "letters"
        checked = plan_experiments.ask_checked(planner, framing, context, question, check)
        assert checked.ok and [e.factors for e in checked.plan.experiments] == [{"tool": False}] * 2 + [{"tool": True}] * 2
        [complaint] = checked.complaints
        # The server's own messages, naming the experiments: an unknown key and a value out of range.
        assert "the server refuses the config of experiment(s) it1-tool1-lr3: unknown config keys: " \
               "['group_sise']" in complaint
        assert "it1-tool0-lr1: temperature: Input should be less than or equal to 4" in complaint
        first, again = (r["messages"][1]["content"] for r in llm.requests if "plan the experiments" in
                        r["messages"][1]["content"].splitlines()[0])
        assert "group_sise" not in first and "Your previous plan was refused" in again and "group_sise" in again

        llm.answer("plan the experiments", _plan(typo=True))  # the same bad key twice: refused
        refused = plan_experiments.ask_checked(planner, framing, context, question, check)
        assert not refused.ok and len(refused.complaints) == 2
        assert all("unknown config keys: ['group_sise']" in c for c in refused.complaints)

    # The check is `swarm serve --check`: a person can run it too (exit 0 when every file is valid).
    done = subprocess.run([*settings.swarm_command, "serve", "--check", "--config", str(LETTERS / "config.toml")],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, f"{LETTERS / 'config.toml'}: ok"), done.stderr


CLIENT = (LETTERS / "client.py").read_text().replace(
    "GROUP_SIZE = 8", 'FACTORS = {"prompt": "plain"}  # client-side factor: "plain" or "hint"\nGROUP_SIZE = 8')


def _state(layout: StudyLayout, iteration: int) -> dict[str, Any]:
    now = time.time()
    framing = {**FRAMING, "task": "lower", "knob": "prompt",
               "factors": [{"name": "prompt", "where": "client", "levels": ["plain", "hint"]}]}
    return {"study_id": layout.study_id, "topic": "plain vs hint prompts", "framing": framing, "iteration": iteration,
            "options": StudyOptions(seeds=2, max_runs=8).model_dump(), "llm": new_usage(), "runs_launched": 0,
            "validation": {"attempts": 0, "ok": False, "error": None},
            "budget": budget.make_budget(now, now + 3600, max_runs=8, max_iterations=3, max_repairs=3,
                                         max_llm_tokens=0, max_llm_cost_usd=0.0)}


def test_each_experiment_folder_gets_its_factor_levels_and_code_changes_are_recorded(tmp_path: Path) -> None:
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=REPO / "prompts")
    layout = StudyLayout("open", settings.studies_root, settings.artifacts_root)
    layout.ensure()
    ctx = StudyContext(settings, layout, OfflinePlanner(sorted(catalog.examples(EXAMPLES))),
                       Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art"), Launcher(settings.swarm_command))
    framing = _state(layout, 1)["framing"]
    plan = IterationPlan.model_validate({"experiments": [{"name": "it1-plain", "hypothesis": "h1", "overrides": {},
                                                          "factors": {"prompt": "plain"}}], "code_change": ""})
    studyfiles.write_plan(layout, 1, plan, framing)
    studyfiles.write_experiment(layout, "it1-plain", CLIENT, {}, "h1")
    arms = [{"name": f"it2-{p}", "hypothesis": "h1", "overrides": {"lr": 3e-3}, "factors": {"prompt": p}}
            for p in ("plain", "hint")]
    studyfiles.write_plan(layout, 2, IterationPlan.model_validate({"experiments": arms, "code_change": ""}), framing)

    out = write_client.write(_state(layout, 2), ctx)  # type: ignore[arg-type]
    assert out["phase"] == "validating"
    for prompt in ("plain", "hint"):
        folder = layout.experiment_dir(f"it2-{prompt}")
        assert {"prompt": prompt} == load_study(folder / "client.py").FACTORS  # self-contained: its own levels
        assert studyfiles.server_config(folder / "config.toml", {})["lr"] == 3e-3  # letters' config + overrides
        assert (folder / "client.py").read_text().replace(f"'prompt': '{prompt}'", '"prompt": "plain"') == CLIENT
    assert "Reused the client of iteration 1 (the plan changes no code)" in layout.log_md.read_text()

    # A code change whose client does not declare the factor its experiments set: the repair step gets the
    # precise message; still wrong after it, the study fails and no folder of the iteration is written.
    plan = IterationPlan.model_validate({"experiments": [{**arms[0], "name": "it3-pad", "factors": {"scratchpad": True}}],
                                         "code_change": "add a scratchpad tool behind FACTORS['scratchpad']"})
    studyfiles.write_plan(layout, 3, plan, framing)
    out = write_client.write(_state(layout, 3), ctx)  # type: ignore[arg-type]
    assert out["phase"] == "failed" and "(even after a repair round)" in out["error"]
    assert "client factor(s) scratchpad that the client's FACTORS does not declare (it declares: prompt)" in out["error"]
    assert not layout.experiment_dir("it3-pad").exists() and not (tmp_path / "mlflow.db").exists()
    assert json.loads(layout.plan_json.read_text())["iterations"]["3"]["code_change"].startswith("add a scratchpad")
