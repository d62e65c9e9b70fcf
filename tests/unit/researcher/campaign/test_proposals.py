"""An LLM's hypotheses beyond the catalog join a goal campaign's round (``researcher.campaign.proposals``),
asked of a real OpenAI-protocol server on loopback with a scripted answer: a key the campaign may move at a
level the server accepts is taken; an unknown key, a fixed one (the engine), a value the server's own
``swarm serve --check`` refuses and a level the screen tests anyway are refused, each named with why in the
ledger; a failing endpoint leaves the catalog alone. The round's screen is unchanged by what is taken."""

from __future__ import annotations

from pathlib import Path

from support.scripted_llm import ScriptedLLM

from researcher.campaign import discover, goal, proposals
from researcher.campaign.record import CampaignRecord
from researcher.campaign.spec import CampaignSpec
from researcher.planner import catalog
from researcher.types.settings import LLMSettings, ResearcherSettings

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "studies" / "examples"
STEP = "propose hypotheses beyond the catalog"
ANSWER = {"hypotheses": [
    {"key": "lr", "value": 2e-3, "why": "the screen brackets 1e-3 with 3e-4 and 3e-3; 2e-3 sits between"},
    {"key": "engine", "value": "vllm", "why": "faster"},
    {"key": "learning_speed", "value": 2, "why": "not a key"},
    {"key": "top_p", "value": 7.0, "why": "out of range"},
    {"key": "max_tokens", "value": 24, "why": "letters answers may need more room"},
]}


def _campaign(tmp_path: Path) -> tuple[CampaignSpec, CampaignRecord, ResearcherSettings]:
    found = goal.read("Make the letters task learn faster per episode consumed", sorted(catalog.examples(EXAMPLES)))
    spec = CampaignSpec.model_validate({"campaign": {"name": "goal", "goal": found.text}})
    rec = CampaignRecord(name="goal", budget_s=8 * 3600.0, study_deadline=0.0, claims=[], goal=found,
                         discovery=discover.start(found, EXAMPLES, 0.02))
    return spec, rec, ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                         examples_root=EXAMPLES, prompts_root=ROOT / "prompts")


def test_an_llms_hypotheses_pass_the_servers_check_and_join_the_round(tmp_path: Path) -> None:
    spec, rec, settings = _campaign(tmp_path)
    d = rec.discovery
    assert d is not None
    screen = d.next_stage()
    task_config = {"lr": 1e-3, "group_size": 8, "batch_groups": 4, "min_group_size": 2, "max_tokens": 16,
                   "temperature": 1.0, "mode": "async", "max_staleness": 1}
    with ScriptedLLM({STEP: [ANSWER]}) as llm:
        settings = settings.model_copy(update={"llm": LLMSettings(base_url=llm.url, model="scripted")})
        proposer = proposals.llm_proposer(settings, rec.goal, task_config)  # type: ignore[arg-type]
        assert proposer is not None
        discover.advance(spec, rec, settings.studies_root, settings.artifacts_root, proposer)
        assert llm.steps == [STEP]
        prompt = llm.requests[0]["messages"][1]["content"]
        assert '"incumbent"' in prompt and "`top_p`" in prompt  # the campaign so far and the keys it may set
        discover.advance(spec, rec, settings.studies_root, settings.artifacts_root, proposer)
        assert llm.steps == [STEP]  # asked once a round
    assert [(p.knob, p.value, p.current) for p in d.proposals] == [("lr", 2e-3, 1e-3), ("max_tokens", 24, 16)]
    assert rec.claims[0].stage == screen  # the screen's arms are what they were
    line = rec.notes[-1]
    assert line.startswith("Round 1: the LLM's hypotheses beyond the catalog") and "lr = 0.002" in line
    assert "engine = vllm: the campaign does not move engine" in line
    assert "learning_speed = 2: not a server config key" in line
    assert "top_p = 7" in line and "less than or equal to 1" in line  # the server's own words


def test_a_failing_endpoint_leaves_the_catalog_alone(tmp_path: Path) -> None:
    _, rec, settings = _campaign(tmp_path)
    d = rec.discovery
    assert d is not None and rec.goal is not None
    with ScriptedLLM({STEP: ["not json at all"] * 5}) as llm:
        settings = settings.model_copy(update={"llm": LLMSettings(base_url=llm.url, model="scripted", max_retries=0)})
        proposer = proposals.llm_proposer(settings, rec.goal, {})
        assert proposer is not None
        taken, refused = proposer(d)
    assert taken == [] and refused and refused[0].startswith("the LLM proposed nothing")
