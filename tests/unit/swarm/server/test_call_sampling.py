"""``swarm.server.call_sampling``: the completion budget and whose temperature/top_p a call samples with."""

from __future__ import annotations

from swarm.config import ServerConfig
from swarm.protocol import ChatCompletionRequest
from swarm.server.call_sampling import ClientSampling, completion_budget
from swarm.server.records.episode import Claim, EpisodeRecord
from swarm.server.records.timeline import EpisodeTrace


def _episode(purpose: str = "train") -> EpisodeRecord:
    return EpisodeRecord(episode_id="e", task_id="t", group_key="t#1", group_id="t", category=None, client_id="c",
                         trace=EpisodeTrace(), claim=Claim(version=0, step=0, lease_s=60.0, expires_at=60.0),
                         purpose=purpose)  # type: ignore[arg-type]


def _request(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_the_budget_is_the_request_then_the_config_then_the_rest_of_the_context() -> None:
    assert completion_budget(7, 64, 100) == 7
    assert completion_budget(None, 64, 100) == 64
    assert completion_budget(None, 64, 10) == 10  # a default never exceeds the room
    assert completion_budget(None, None, 100) == 100
    assert ServerConfig().max_tokens is None  # built in: the rest of the context, as OpenAI and vLLM


def test_honor_samples_as_asked_and_pin_holds_training_calls_only() -> None:
    honor, pin = ServerConfig(), ServerConfig(client_sampling="pin", temperature=0.9, top_p=0.95)
    assert honor.client_sampling == "honor"  # the default keeps what clients ask for (module docstring)
    chooser, episode = ClientSampling(), _episode()
    assert chooser.choose(_request(temperature=0.1), honor, episode) == (0.1, 1.0)
    assert chooser.choose(_request(), honor, episode) == (1.0, 1.0)  # no deviation: not counted
    assert (chooser.honoured, chooser.overridden, episode.trace.sampling_overridden) == (1, 0, 0)
    assert chooser.choose(_request(temperature=0.1, top_p=0.5), pin, episode) == (0.9, 0.95)
    assert chooser.choose(_request(top_p=0.5), pin, _episode("eval")) == (0.9, 0.5)  # an eval is never pinned
    assert chooser.choose(_request(temperature=0.0), pin, None) == (0.0, 0.95)  # nor a control-token call
    assert (chooser.honoured, chooser.overridden, episode.trace.sampling_overridden) == (1, 1, 1)
    assert chooser.counts().model_dump() == {"honoured": 1, "overridden": 1}
