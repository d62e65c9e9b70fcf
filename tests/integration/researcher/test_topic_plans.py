"""The asked question is the tested question: topics become plans that run exactly the named arms.

The offline planner is driven with real topics and the real example configs; the LLM path uses the
real ``LLMPlanner`` against a scripted OpenAI-protocol server on loopback through the plan node's
check (``ask_checked``); the node itself is driven with a scripted planner object (a stand-in for
the LLM) to show that a plan refused twice fails the study before anything is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.scripted_llm import ScriptedLLM

from researcher.planner import catalog, topic
from researcher.planner.llm import LLMPlanner
from researcher.planner.offline import OfflinePlanner
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import Reply
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.session.nodes import plan_experiments
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.design import DATA_TASK, Framing, Plan, same_value
from researcher.types.settings import LLMSettings, ResearcherSettings, StudyOptions
from researcher.types.usage import new_usage

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "studies" / "examples"
TASKS = sorted(catalog.examples(EXAMPLES))
KL_TOPIC = "Does a KL coefficient of 0.05 beat 0.2 on digits?"
KL_FRAMING = Framing(answerable=True, reason="named", question="kl 0.05 vs 0.2 on digits", task="digits", knob="kl_coef")


def _offline_plan(text: str, iteration: int = 1, **context: Any) -> tuple[Framing, Any, topic.TopicQuestion]:
    planner = OfflinePlanner(TASKS)
    framing = planner.frame(text, catalog.describe(EXAMPLES)).value
    task_config = studyfiles.server_config(catalog.examples(EXAMPLES)[framing.task].config, {})
    plan = planner.plan(framing, {"iteration": iteration, "topic": text, "task_config": task_config,
                                  "min_effect": 0.02, **context}).value
    return framing, plan, topic.parse(text)


# (topic, task, knob, exact values run, shape, a phrase the assumptions must contain or None)
PHRASINGS = [
    (KL_TOPIC, "digits", "kl_coef", [0.05, 0.2], "comparison", None),
    ("Is a learning rate of 3e-3 better than 1e-4 for letters?", "letters", "lr", [3e-3, 1e-4], "comparison", None),
    ("Does group size 2 or 32 learn faster on the letters task?", "letters", "group_size", [2, 32], "comparison", None),
    ("Does training with and without KL differ on digits?", "digits", "kl_coef", [0.0, 0.05], "comparison",
     "standard alternative"),
    ("Token-level vs sequence-level importance correction on the calculator?", "calculator", "rollout_is",
     ["token", "sequence"], "comparison", None),
    ("How does the KL coefficient affect how fast digits learns?", "digits", "kl_coef", [0.0, 0.01, 0.05, 0.2], "sweep",
     "swept the catalog's 4 values"),
    ("What is the best learning rate for digit reversal?", "digits", "lr", [1e-4, 3e-4, 1e-3, 3e-3, 1e-2], "sweep", None),
    ("How does group size from 2 to 32 affect learning on letters?", "letters", "group_size", [2, 4, 8, 16, 32], "sweep",
     "from 2 to 32"),
    ("Does a learning rate of 3e-3 help on letters?", "letters", "lr", [1e-3, 3e-3], "comparison",
     "task's configured value"),
    ("Does the GSPO policy loss beat vanilla clipping on digits?", "digits", "policy_loss", ["gspo", "vanilla"],
     "comparison", None),
    ("Which advantage estimator works best: grpo or rloo?", "letters", "adv_estimator", ["grpo", "rloo"], "comparison",
     "names no task"),
    ("Does vLLM rollout change learning on the letters task?", "letters", "engine", ["torch", "vllm"], "comparison",
     "off/standard value"),
    ("Does a temperature of 0.5 vs 1.3 change learning on letters?", "letters", "temperature", [0.5, 1.3], "comparison",
     None),
    ("Is a batch size of 2 better than 8 on digits?", "digits", "batch_groups", [2, 8], "comparison", None),
    ("How much policy lag can async training on the calculator tolerate?", "calculator", "max_staleness", [0, 1, 2, 4],
     "sweep", None),
    ("Does timeline merging help?", "calculator", "merge_timelines", [False, True], "comparison", None),
    ("Does training on verl's FSDP2 workers change learning on digits?", "digits", "trainer", ["torch", "verl"],
     "comparison", None),
    ("Does a learning rate of 5 beat 1e-3 on sudoku?", "letters", "lr", [0.1, 1e-3], "comparison",
     "outside the range the researcher runs"),
    # A/A checks: one configuration twice (the knob is the one named, else lr as the task configures it).
    ("A/A check: do two identical configurations of letters learn at different speeds?", "letters", "lr",
     [1e-3, 1e-3], "comparison", "an A/A check names no knob"),
    ("Do identical arms on digits learn at the same speed?", "digits", "lr", [3e-4, 3e-4], "comparison",
     "both arms run lr=0.0003, the task's configured value"),
    ("Run the same configuration twice on letters: does one learn faster?", "letters", "lr", [1e-3, 1e-3],
     "comparison", "reported under lr"),
    ("An A/A test at group size 4 on the calculator", "calculator", "group_size", [4, 4], "comparison", None),
]


@pytest.mark.parametrize(("text", "task", "knob", "values", "shape", "assumed"), PHRASINGS,
                         ids=[p[0][:48] for p in PHRASINGS])
def test_topic_runs_exactly_the_named_arms(text: str, task: str, knob: str, values: list[Any], shape: str,
                                           assumed: str | None) -> None:
    framing, plan, question = _offline_plan(text)
    assert (framing.task, framing.knob) == (task, knob)
    ran = [e.overrides[knob] for e in plan.experiments]
    assert len(ran) == len(values) and all(any(same_value(r, v) for r in ran) for v in values), ran
    assert all(type(r) is type(v) for r, v in zip(sorted(ran, key=str), sorted(values, key=str))), ran
    assert (plan.shape, question.shape, plan.stage) == (shape, shape, "initial")
    if shape == "sweep":
        assert len(set(map(str, ran))) >= min(4, len(catalog.knob(knob).ladder))
    notes = " ".join([*question.assumptions, *plan.assumptions])
    if assumed:
        assert assumed in notes, notes
    # The plan node's check accepts what the offline planner runs.
    assert topic.plan_complaint(question, framing.knob, [e.overrides for e in plan.experiments]) is None


AA_TOPIC = "A/A check: do two identical configurations of letters learn at different speeds?"


def test_an_a_a_topic_runs_one_configuration_twice_and_only_an_identical_plan_passes() -> None:
    framing, plan, question = _offline_plan(AA_TOPIC)
    assert question.identical and "A/A check" in framing.question
    assert [(e.name, e.overrides) for e in plan.experiments] == [("it1-a", {"lr": 1e-3}), ("it1-a-copy", {"lr": 1e-3})]
    # Unresolved: both arms again, under fresh names, on the same identical configuration.
    unresolved = {"iteration": 1, "best": "it1-a", "best_value": 1e-3, "plateau": None,
                  "values": {"it1-a": 1e-3, "it1-a-copy": 1e-3},
                  "comparison": {"better": "it1-a", "worse": "it1-a-copy", "diff": 0.01, "hw": 0.05, "clear": False}}
    _, again, _ = _offline_plan(AA_TOPIC, 2, best_value=1e-3, tested_values=[1e-3, 1e-3], history=[unresolved])
    assert again.stage == "replicate"
    assert [(e.name, e.overrides) for e in again.experiments] == [("it2-a", {"lr": 1e-3}), ("it2-a-copy", {"lr": 1e-3})]
    planner = OfflinePlanner(TASKS)
    decide = lambda c: planner.decide(framing, {"topic": AA_TOPIC, "tested_values": [1e-3], "min_effect": 0.02,  # noqa: E731
                                                "last": {**unresolved, "comparison": c}}).value
    assert decide(unresolved["comparison"]).action == "continue"
    assert decide({**unresolved["comparison"], "diff": 0.001, "hw": 0.01}).action == "conclude"
    clear = decide({**unresolved["comparison"], "diff": 0.1, "hw": 0.01, "clear": True})
    assert clear.action == "conclude" and "identical configurations" in clear.reason
    # The LLM plan check: two identical arms pass (whatever the knob is set to, or none); varying anything fails.
    assert topic.plan_complaint(question, "lr", [{"lr": 3e-3}, {"lr": 3e-3}]) is None
    assert topic.plan_complaint(question, "lr", [{}, {}]) is None
    varied = topic.plan_complaint(question, "lr", [{"lr": 1e-3}, {"lr": 3e-3}])
    assert varied and "the plan varies `lr`" in varied
    extra = topic.plan_complaint(question, "lr", [{"lr": 1e-3}, {"lr": 1e-3, "kl_coef": 0.05}])
    assert extra and "the plan varies `kl_coef`" in extra
    assert "the plan has 1" in (topic.plan_complaint(question, "lr", [{"lr": 1e-3}]) or "")
    pinned = topic.parse("An A/A test at group size 4 on the calculator")
    assert topic.plan_complaint(pinned, "group_size", [{"group_size": 4}, {"group_size": 4}]) is None
    off = topic.plan_complaint(pinned, "group_size", [{"group_size": 8}, {"group_size": 8}])
    assert off and "the topic sets group_size = 4" in off


def test_unknown_task_and_out_of_range_values_are_stated_as_assumptions() -> None:
    question = topic.parse("Does a learning rate of 5 beat 1e-3 on sudoku?")
    notes = " ".join(question.assumptions)
    assert "'sudoku', which is not an example study" in notes and "ran letters" in notes
    assert "lr = 5 is outside the range the researcher runs (1e-06 to 0.1); ran 0.1" in notes
    pinned = topic.parse("Does lr 3e-3 beat lr 1e-4 at group size 4 on letters, in 30 steps with 3 seeds?")
    assert (pinned.knob, pinned.values, dict(pinned.fixed)) == ("lr", (3e-3, 1e-4), {"group_size": 4})
    _, plan, _ = _offline_plan(pinned.text)
    assert [e.overrides for e in plan.experiments] == [{"group_size": 4, "lr": 3e-3}, {"group_size": 4, "lr": 1e-4}]
    assert topic.parse("Is the moon made of cheese?").knob is None


def test_later_iterations_add_seeds_to_an_unresolved_pair_and_refine_a_resolved_sweep() -> None:
    text = "How does the learning rate affect how fast digits learns?"
    values = {"a": 1e-4, "b": 3e-4, "c": 1e-3, "d": 3e-3, "e": 1e-2}
    tested = list(values.values())
    unresolved = {"iteration": 1, "best": "c", "best_value": 1e-3, "values": values, "plateau": "lr plateaued",
                  "comparison": {"better": "c", "worse": "d", "diff": 0.03, "hw": 0.14, "clear": False}}
    _, plan, _ = _offline_plan(text, 2, best_value=1e-3, tested_values=tested, history=[unresolved])
    assert plan.stage == "replicate" and [e.overrides["lr"] for e in plan.experiments] == [1e-3, 3e-3]
    planner = OfflinePlanner(TASKS)
    framing = planner.frame(text, "").value
    decision = planner.decide(framing, {"topic": text, "last": unresolved, "tested_values": tested,
                                        "min_effect": 0.02}).value
    assert decision.action == "continue" and "unresolved" in decision.reason and "plateau" not in decision.reason
    assert "best" not in decision.reason.replace("better", "")

    resolved = {**unresolved, "comparison": {**unresolved["comparison"], "hw": 0.01, "clear": True}}
    _, plan, _ = _offline_plan(text, 2, best_value=1e-3, tested_values=tested, history=[resolved])
    assert plan.stage == "refine" and [e.overrides["lr"] for e in plan.experiments] == [1e-3, 5.5e-4, 1.7e-3]
    same = {**unresolved, "comparison": {**unresolved["comparison"], "diff": 0.004, "hw": 0.01}}
    decision = planner.decide(framing, {"topic": text, "last": same, "tested_values": tested, "min_effect": 0.02}).value
    assert decision.action == "conclude" and decision.reason.startswith("no meaningful difference")

    named = planner.frame(KL_TOPIC, "").value
    done = planner.decide(named, {"topic": KL_TOPIC, "tested_values": [0.05, 0.2], "last": {
        "best_value": 0.05, "values": {"x": 0.05, "y": 0.2}, "plateau": None,
        "comparison": {"better": "x", "worse": "y", "diff": 0.1, "hw": 0.04, "clear": True}}}).value
    assert done.action == "conclude" and "named arms is resolved" in done.reason

    caveats = "Refinement, iteration 2 (over 30 steps): c − d = +0.030 ± 0.140 (CI includes 0); lr plateaued."
    report = planner.report(framing, {"verdict": "Inconclusive: …", "caveats": caveats,
                                      "iterations": [{**unresolved, "iteration": 2}]}).value
    assert "plateaued" not in report.discussion and "no plateau is claimed" in report.discussion


def test_llm_plan_checks_catch_dropped_values_wrong_knob_and_too_short_sweeps() -> None:
    question = topic.parse(KL_TOPIC)
    complaint = topic.plan_complaint(question, "kl_coef", [{"kl_coef": 0.05}, {"kl_coef": 0.0}])
    assert complaint and "drops kl_coef = 0.2" in complaint
    assert "explicitly" in (topic.plan_complaint(question, "kl_coef", [{"kl_coef": 0.05}, {"kl_coef": 0.2}, {}]) or "")
    assert topic.plan_complaint(question, "kl_coef", [{"kl_coef": 0.2}], tested=[0.05]) is None  # ran before
    assert "`kl_coef`, not `lr`" in (topic.framing_complaint(question, "lr", "digits") or "")
    assert "digits task" in (topic.framing_complaint(question, "kl_coef", "letters") or "")
    sweep = topic.parse("How does the KL coefficient affect how fast digits learns?")
    short = topic.plan_complaint(sweep, "kl_coef", [{"kl_coef": 0.0}, {"kl_coef": 0.05}], room=5)
    assert short and "at least 4 distinct values" in short
    assert topic.plan_complaint(sweep, "kl_coef", [{"kl_coef": v} for v in (0.0, 0.01, 0.05, 0.2)]) is None


# ---------------------------------------------------------------------- the LLM path on loopback


def _plan_answer(*values: float) -> str:
    return json.dumps({"rationale": "scripted", "hypotheses": [
        {"id": "h1", "statement": "kl matters", "metric": "train/reward_mean", "expected_effect": "higher AUC"}],
        "experiments": [{"name": f"it1-kl-{i}", "hypothesis": "h1", "overrides": {"kl_coef": v}}
                        for i, v in enumerate(values)]})


@pytest.fixture
def chat() -> Iterator[ScriptedLLM]:
    """A scripted OpenAI-protocol server; each test scripts the answers it needs."""
    with ScriptedLLM({}) as llm:
        yield llm


def _llm(server: ScriptedLLM) -> LLMPlanner:
    return LLMPlanner(LLMSettings(base_url=server.url, model="scripted", max_retries=0), PromptLibrary(REPO / "prompts"))


def test_llm_plan_dropping_a_named_value_is_repaired_with_the_precise_complaint(chat: ScriptedLLM) -> None:
    chat.answer("plan the experiments", _plan_answer(0.05, 0.0), _plan_answer(0.05, 0.2))
    context = {"iteration": 1, "topic": KL_TOPIC, "named": topic.parse(KL_TOPIC).summary(), "tested_values": [],
               "runs_left": 16, "seeds_per_experiment": 3}
    checked = plan_experiments.ask_checked(_llm(chat), KL_FRAMING, context, topic.parse(KL_TOPIC))
    assert checked.ok and [e.overrides for e in checked.plan.experiments] == [{"kl_coef": 0.05}, {"kl_coef": 0.2}]
    assert len(checked.complaints) == 1 and "drops kl_coef = 0.2" in checked.complaints[0]
    assert checked.usage["calls"] == 2 and len(chat.requests) == 2
    first, again = (r["messages"][1]["content"] for r in chat.requests)
    assert "run every named value exactly" in first.lower() and '"values": [\n      0.05,\n      0.2\n    ]' in first
    assert "Your previous plan was refused" in again and "drops kl_coef = 0.2" in again and "refused_plan" in again


class _ScriptedPlanner:
    """Stands in for an LLM that keeps answering the same plan (only ``plan`` is asked here)."""

    name = "scripted"

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.contexts: list[dict[str, Any]] = []

    def plan(self, framing: Framing, context: dict[str, Any]) -> Reply[Plan]:
        self.contexts.append(context)
        return Reply(Plan.model_validate_json(self.answer), {**new_usage(), "calls": 1})


def test_plan_node_refuses_a_plan_that_keeps_dropping_a_named_value(tmp_path: Path) -> None:
    planner = _ScriptedPlanner(_plan_answer(0.05, 0.0))  # the same wrong plan twice
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=REPO / "prompts")
    layout = StudyLayout("kl-named", settings.studies_root, settings.artifacts_root)
    layout.ensure()
    ctx = StudyContext(settings, layout, planner, Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art"),
                       Launcher(settings.swarm_command))  # type: ignore[arg-type]
    now = time.time()
    state = {"study_id": "kl-named", "topic": KL_TOPIC, "framing": KL_FRAMING.model_dump(),
             "options": StudyOptions(seeds=2, max_runs=8).model_dump(), "iterations": [], "llm": new_usage(),
             "runs_launched": 0, "budget": budget.make_budget(now, now + 3600, max_runs=8, max_iterations=3,
                                                              max_repairs=3, max_llm_tokens=100_000,
                                                              max_llm_cost_usd=0.0)}
    out = plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    assert out["phase"] == "failed" and "even after a repair round" in out["error"]
    assert "drops kl_coef = 0.2" in out["error"] and out["llm"]["calls"] == 2
    first, again = planner.contexts
    assert first["named"]["values"] == [0.05, 0.2] and first["task_config"]["lr"] == 3e-4  # digits' config.toml
    assert "complaint" not in first and "drops kl_coef = 0.2" in again["complaint"]
    assert again["refused_plan"]["experiments"][1]["overrides"] == {"kl_coef": 0.0}
    # Nothing was planned: no plan.json, no MLflow run; LOG.md says why, twice.
    assert not layout.plan_json.exists() and not (tmp_path / "mlflow.db").exists()
    assert layout.log_md.read_text().count("the planner's plan was refused") == 2


def test_a_topic_naming_no_task_run_on_the_users_data_says_so() -> None:
    """A campaign claim with ``data`` runs the user's data task: the plan's notes must not say letters ran."""
    reading = topic.parse("Does a random reward of 0.5 slow learning compared with 0?")
    assert reading.task == catalog.DEFAULT_TASK and "ran letters" in " ".join(reading.assumptions)
    on_data = topic.on_task(reading, DATA_TASK)
    notes = " ".join(on_data.assumptions)
    assert on_data.task == DATA_TASK and "ran letters" not in notes and "own data task" in notes
    named = topic.parse(KL_TOPIC)
    assert topic.on_task(named, DATA_TASK) is named  # a task the topic names stays its task
    # A designed study on the data task names it ("makes the data task learn faster"): the same notes.
    designed = topic.on_task(topic.parse("Which of lr = 1e-05 or lr = 3e-05 makes the data task learn faster?"),
                             DATA_TASK)
    assert designed.assumptions == ("the topic names no example task; ran the study's own data task",)
