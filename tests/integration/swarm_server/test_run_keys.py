"""Run keys on a real server: one openai client holding one key for a whole run, as a one-key
framework (verifiers' ``vf-eval``) holds it. Each new conversation opens its own episode in the
group of its prompt, a conversation's later turns continue it (a tool round trip merges into one
sample), every response names its episode, rewards go in by episode or response id, and an episode
nobody rewards expires by its lease (``swarm.server.episodes.runs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import RunningServer
from support import wait_for
from taught_tools import ADD, ANSWER, QUESTION

from swarm.client import SwarmClient
from swarm.protocol import EpisodeState

pytestmark = pytest.mark.slow

HEADER = "x-swarm-episode"
ADD_TOOL = {"type": "function", **ADD["function"], "strict": False}  # the Responses form of ADD


def _mint(server: RunningServer, run: str, token: str | None = None) -> dict[str, Any]:
    with server.client(token) as http:
        minted = http.post("/api/v1/runs", json={"run": run})
    assert minted.status_code == 200, minted.text
    return dict(minted.json())


def _llm(minted: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=minted["base_url"], api_key=minted["api_key"], max_retries=0)


def _chat(llm: openai.OpenAI, messages: list[dict], **fields: Any) -> tuple[str, Any]:
    """One chat call: the episode it names (header and body agree) and the completion."""
    raw = llm.chat.completions.with_raw_response.create(model="tiny", messages=messages, **fields)
    completion = raw.parse()
    assert completion.model_extra["episode_id"] == raw.headers[HEADER]
    return raw.headers[HEADER], completion


def _turn_two(first: Any) -> list[dict]:
    """The taught tool loop's second turn: the question, the call as returned, the tool's result."""
    message = first.choices[0].message
    [call] = message.tool_calls
    assert call.function.name == "add"
    sent = {"role": "assistant", "content": message.content, "tool_calls": [call.model_dump()]}
    return [*QUESTION, sent, {"role": "tool", "tool_call_id": call.id, "content": "5"}]


def _post(server: RunningServer, token: str, id_: str, reward: float) -> httpx.Response:
    with server.client(token) as http:
        return http.post(f"/api/v1/episodes/{id_}/finish", json={"reward": reward})


@pytest.fixture
def server(tool_model: Path, start_server) -> RunningServer:
    # A learning rate too small to move the taught loop: the steps train, the loop stays as taught.
    return start_server(model_dir=tool_model, group_size=2, min_group_size=1, batch_groups=1, lr=1e-7)


def test_one_key_n_conversations_are_n_episodes_each_trained_as_one_sample(server: RunningServer) -> None:
    minted = _mint(server, "evals")
    llm, key = _llm(minted), minted["api_key"]
    tool = {"tools": [ADD], "temperature": 0.0}
    seen: list[str] = []
    for _ in range(3):  # two interleaved tool loops on one prompt: one group, one step each
        step = server.core.step
        a, a1 = _chat(llm, QUESTION, **tool, max_tokens=64)
        b, b1 = _chat(llm, QUESTION, **tool, max_tokens=64)
        assert a != b and server.core.lifecycle.get(a).group_key == server.core.lifecycle.get(b).group_key
        a_again, a2 = _chat(llm, _turn_two(a1), **tool, max_tokens=32)
        b_again, _b2 = _chat(llm, _turn_two(b1), **tool, max_tokens=32)
        assert (a_again, b_again) == (a, b) and a2.choices[0].message.content == ANSWER
        for episode in (a, b):
            trace = server.core.lifecycle.get(episode).trace
            assert trace.calls == 2 and len(trace.timelines) == 1 and trace.drift_forks == 0
        assert _post(server, key, a2.id, 1.0).status_code == 200  # by the id of the response it answers
        assert _post(server, key, b, 0.0).status_code == 200  # by the episode the header named
        wait_for(lambda s=step: server.core.step > s, timeout=120, what="a step on the tool group")
        assert (server.core.store.get(a).outcome.reward, server.core.store.get(b).outcome.reward) == (1.0, 0.0)
        seen += [a, b]
    step = server.core.step
    with SwarmClient(server.url, token=server.token, retry_for_s=10) as swarm:
        for seed in (1, 2):  # single-turn conversations on another prompt: their own group
            episode, reply = _chat(llm, [{"role": "user", "content": "Say hi."}], temperature=1.0, seed=seed,
                                   max_tokens=8)
            assert swarm.finish(reply.id, reward=float(seed)).state is EpisodeState.finished
            seen.append(episode)
    wait_for(lambda: server.core.step > step, timeout=120, what="a step on the single-turn group")
    assert len(set(seen)) == len(seen) == 8 and server.core.step >= 4
    for row in server.core.metrics[-4:]:
        assert row.metrics["context/samples_per_episode"] == 1.0 and row.metrics["context/drift_forks"] == 0


def test_sessions_keep_rollouts_whose_replies_are_the_same_apart(server: RunningServer) -> None:
    """verifiers sends its rollout's trace id as ``X-Session-ID`` on every turn: a session is its own
    episode even where prefixes are ambiguous, and the run's key posts its reward by that id."""
    minted = _mint(server, "vf")
    llm, key = _llm(minted), minted["api_key"]

    def chat(session: str, messages: list[dict], max_tokens: int) -> tuple[str, Any]:
        return _chat(llm, messages, tools=[ADD], temperature=0.0, max_tokens=max_tokens,
                     extra_headers={"X-Session-ID": session})

    step = server.core.step
    a, a1 = chat("rollout-a", QUESTION, 64)
    b, b1 = chat("rollout-b", QUESTION, 64)
    assert a != b and a1.choices[0].message.tool_calls[0].function == b1.choices[0].message.tool_calls[0].function
    b_again, _ = chat("rollout-b", _turn_two(b1), 32)  # b first: by prefix alone it would continue a, the oldest
    a_again, _ = chat("rollout-a", _turn_two(a1), 32)
    assert (a_again, b_again) == (a, b)
    assert all(len(server.core.lifecycle.get(e).trace.timelines) == 1 for e in (a, b))
    assert _post(server, server.token, "rollout-a", 1.0).status_code == 404  # a session is named by its run's key
    assert _post(server, key, "rollout-a", 1.0).status_code == 200
    assert _post(server, key, "rollout-b", 0.0).status_code == 200
    wait_for(lambda: server.core.step > step, timeout=120, what="a step on the two sessions")
    assert (server.core.store.get(a).outcome.reward, server.core.store.get(b).outcome.reward) == (1.0, 0.0)


def test_responses_and_streams_name_their_episode_and_the_unrewarded_expire(tool_model: Path,
                                                                            start_server) -> None:
    server = start_server(model_dir=tool_model, group_size=2, min_group_size=1, batch_groups=1, lease_s=3.0)
    minted = _mint(server, "agents")
    llm, key = _llm(minted), minted["api_key"]
    raw = llm.responses.with_raw_response.create(model="tiny", input=QUESTION[0]["content"], tools=[ADD_TOOL],
                                                 temperature=0.0, max_output_tokens=64)
    first = raw.parse()
    episode = raw.headers[HEADER]
    assert first.model_extra["episode_id"] == episode and first.output[0].type == "function_call"
    call = first.output[0]
    history = [QUESTION[0], call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    events = list(llm.responses.create(model="tiny", input=history, tools=[ADD_TOOL], temperature=0.0,
                                       max_output_tokens=32, stream=True))
    final = events[-1].response
    assert final.output_text == ANSWER and final.model_extra["episode_id"] == episode
    assert len(server.core.lifecycle.get(episode).trace.timelines) == 1
    assert _post(server, key, final.id, 1.0).status_code == 200

    with llm.chat.completions.with_streaming_response.create(
            model="tiny", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, stream=True) as streamed:
        unrewarded = streamed.headers[HEADER]
        chunks = list(streamed.parse())
    assert unrewarded != episode and {c.model_extra["episode_id"] for c in chunks} == {unrewarded}
    wait_for(lambda: server.core.lifecycle.get(unrewarded).state is EpisodeState.expired, timeout=30,
             what="the unrewarded episode's lease to run out")
    late = _post(server, key, unrewarded, 1.0)
    assert late.status_code == 410 and "expired" in late.json()["error"]["message"]


def test_repeated_prompts_form_groups_of_the_servers_group_size(start_server) -> None:
    server = start_server(group_size=2, min_group_size=1, batch_groups=8)
    llm = _llm(_mint(server, "grpo"))
    episodes = [_chat(llm, [{"role": "user", "content": "Say hi."}], max_tokens=2)[0] for _ in range(3)]
    other, _ = _chat(llm, [{"role": "user", "content": "Say bye."}], max_tokens=2)
    records = [server.core.lifecycle.get(e) for e in [*episodes, other]]
    assert len({r.episode_id for r in records}) == 4
    assert records[0].group_key == records[1].group_key != records[2].group_key  # a third repeat: a new group
    assert records[0].group_id == records[2].group_id != records[3].group_id
    assert {r.client_id for r in records} == {"run:grpo"} and server.core.counts.claimed == 4


def test_bad_keys_and_unknown_ids_are_clear_4xx_answers(start_server) -> None:
    server = start_server(group_size=2, min_group_size=1)
    client_token = (server.state_dir / "client_token").read_text().strip()
    mine, theirs = _mint(server, "mine", client_token), _mint(server, "theirs")
    episode, reply = _chat(_llm(mine), [{"role": "user", "content": "Say hi."}], max_tokens=2)
    with server.client() as http:
        claimed = http.post("/api/v1/episodes", json={"task_id": "t"}).json()

    forged = _llm({**mine, "api_key": mine["api_key"][:-4] + "0000"})
    with pytest.raises(openai.AuthenticationError, match="invalid run key"):
        forged.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    for unknown in ("chatcmpl-nope", "resp_nope"):
        answer = _post(server, mine["api_key"], unknown, 1.0)
        assert answer.status_code == 404 and f"unknown response id {unknown}" in answer.json()["error"]["message"]
    expected = {  # (credential, id) -> status: a run key opens its own run's episodes only
        (theirs["api_key"], episode): 403, (theirs["api_key"], reply.id): 403,
        (mine["api_key"], claimed["episode_id"]): 403, (claimed["api_key"], reply.id): 403,
    }
    for (credential, id_), status in expected.items():
        assert _post(server, credential, id_, 1.0).status_code == status, (credential, id_)
    with server.client(mine["api_key"]) as http:
        assert http.post("/api/v1/episodes", json={"task_id": "t"}).status_code == 403
        assert http.post("/api/v1/runs", json={"run": "more"}).status_code == 403
        assert http.get("/api/v1/status").status_code == 403
        assert http.get("/v1/models").status_code == 200
    with server.client() as http:
        assert http.post("/api/v1/runs", json={"run": "a.b"}).status_code == 422
    assert _post(server, mine["api_key"], reply.id, 0.5).status_code == 200
    assert server.core.lifecycle.get(episode).state is EpisodeState.finished
    assert _post(server, mine["api_key"], reply.id, 0.5).status_code == 200  # a retried finish is a no-op


def test_a_run_key_survives_a_restart(tiny_model: Path, start_server, tmp_path: Path) -> None:
    state_dir = tmp_path / "kept"
    first = start_server(state_dir=state_dir)
    minted = _mint(first, "long")
    first.stop()
    second = start_server(state_dir=state_dir)
    llm = openai.OpenAI(base_url=f"{second.url}/v1", api_key=minted["api_key"], max_retries=0)
    episode, _ = _chat(llm, [{"role": "user", "content": "hi"}], max_tokens=2)
    assert second.core.lifecycle.get(episode).client_id == "run:long"
