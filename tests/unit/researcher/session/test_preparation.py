"""A study's preparation through the one composition root (``researcher.session.preparation`` and
``composition``), in process: a start's flags refused before the study's files are written, a topic
the offline planner cannot map refused with what it can study, and the checkout's examples and prompts
found from any working directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from researcher.planner.offline import OfflinePlanner
from researcher.session.composition import build_settings
from researcher.session.preparation import Refused, StartRequest, prepare_start
from researcher.study.layout import StudyLayout

REPO = Path(__file__).resolve().parents[4]
TOPIC = "Does a larger GRPO group size make the letters task learn faster?"


@pytest.fixture(autouse=True)
def _offline_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No LLM in the environment, and a working directory that is not the checkout."""
    for name in ("RESEARCHER_LLM_BASE_URL", "RESEARCHER_LLM_MODEL", "MLFLOW_TRACKING_URI", "SWARM_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def _request(tmp_path: Path, **given: object) -> StartRequest:
    return StartRequest(topic=str(given.pop("topic", TOPIC)), studies_dir=tmp_path / "studies",
                        artifacts_dir=tmp_path / "artifacts", study_id="s1", **given)  # type: ignore[arg-type]


def test_the_composition_root_builds_the_settings_from_flags_and_the_environment(tmp_path: Path) -> None:
    settings = build_settings(Path("studies"), Path("artifacts"), env={"RESEARCHER_LLM_BASE_URL": "http://llm/v1",
                                                                      "RESEARCHER_LLM_MODEL": "m", "SWARM_TOKEN": "t"})
    assert settings.examples_root == REPO / "studies" / "examples"  # the checkout's, not the cwd's (none here)
    assert settings.prompts_root == REPO / "prompts" and settings.studies_root == tmp_path / "studies"
    assert settings.llm is not None and settings.llm.model == "m" and settings.server_token == "t"
    with pytest.raises(ValueError, match="set both RESEARCHER_LLM_BASE_URL and RESEARCHER_LLM_MODEL"):
        build_settings(Path("studies"), Path("artifacts"), env={"RESEARCHER_LLM_MODEL": "m"})
    with pytest.raises(ValueError, match="--server must be an http"):
        build_settings(Path("studies"), Path("artifacts"), servers=["127.0.0.1:8000"], env={})


def test_bad_flags_are_refused_before_the_study_has_a_file(tmp_path: Path) -> None:
    for given, message in (({"budget": "soon"}, "soon"), ({"window": "a while"}, "a while"),
                           ({"options": {"seeds": 0}}, "seeds")):
        with pytest.raises(Refused, match=message):
            prepare_start(_request(tmp_path, **given))
    assert not (tmp_path / "studies").exists()


def test_a_topic_the_offline_planner_cannot_map_is_refused_with_what_it_can_study(tmp_path: Path) -> None:
    with pytest.raises(Refused) as refused:
        prepare_start(_request(tmp_path, topic="What is the airspeed of an unladen swallow?"))
    assert "letters" in str(refused.value)  # it names the tasks it can study
    layout = StudyLayout("s1", tmp_path / "studies", tmp_path / "artifacts")
    assert not layout.study_toml.exists() and not layout.graph_db.exists()


def test_a_good_start_is_prepared_with_the_offline_planner_and_its_deadline(tmp_path: Path) -> None:
    prepared = prepare_start(_request(tmp_path, budget="2h", options={"seeds": 2}))
    assert isinstance(prepared.ctx.planner, OfflinePlanner) and prepared.ctx.layout.study_id == "s1"
    assert prepared.options.seeds == 2 and prepared.topic == TOPIC
    assert 2 * 3600 - 60 < prepared.deadline - time.time() <= 2 * 3600
    assert not prepared.ctx.layout.study_toml.exists()  # written when the study starts, not before
