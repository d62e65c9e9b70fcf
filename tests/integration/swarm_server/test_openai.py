"""The official openai SDK against an episode's base_url/api_key, on a real server and tiny model."""

from __future__ import annotations

import httpx
import openai
import pytest

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Spell abc."}]


@pytest.fixture
def server(start_server):
    return start_server(group_size=1, min_group_size=1, batch_groups=1000, max_tokens=24)


def _claim(server, task: str = "t") -> dict:
    with server.client() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task})
    assert response.status_code == 200, response.text
    return response.json()


def _llm(episode: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)


def test_plain_n_stop_logprobs_and_recording(server) -> None:
    episode = _claim(server)
    llm = _llm(episode)
    plain = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, seed=1)
    choice = plain.choices[0]
    assert plain.object == "chat.completion" and choice.finish_reason in ("stop", "length")
    extra = plain.model_extra
    assert extra["policy_version"] == 0 and extra["prompt_token_ids"]
    assert plain.usage.prompt_tokens == len(extra["prompt_token_ids"])
    assert plain.usage.completion_tokens == len(choice.model_extra["token_ids"]) <= 16

    many = llm.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=12, seed=2,
                                       temperature=1.0, logprobs=True)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for c in many.choices:
        ids = c.model_extra["token_ids"]
        assert len(c.logprobs.content) == len(ids)
        assert all(lp.logprob <= 0.0 for lp in c.logprobs.content)

    stopped = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, seed=3,
                                          temperature=0.0, stop=["e", "a", "o"])
    assert not any(s in stopped.choices[0].message.content for s in ("e", "a", "o"))

    # What the server recorded decodes to exactly what each client saw.
    core = server.core
    trace = core.lifecycle.get(episode["episode_id"]).trace
    backend = core.generator.local
    seen = [plain.choices[0], *list(many.choices), stopped.choices[0]]
    recorded = []
    for timeline in trace.timelines:
        generated = [t for t, m in zip(timeline.tokens, timeline.loss_mask) if m == 1]
        recorded.append(backend.text.decode(generated))
    assert sorted(recorded) == sorted(c.message.content for c in seen)
    # And the log-probs recorded for the n=3 call are exactly the ones returned to the client.
    returned = sorted(tuple(lp.logprob for lp in c.logprobs.content) for c in many.choices)
    stored = sorted(tuple(lp for lp, m in zip(t.logprobs, t.loss_mask) if m) for t in trace.timelines)
    assert all(r in stored for r in returned)


def test_stream_equals_token_ids_decode(server) -> None:
    episode = _claim(server)
    llm = _llm(episode)
    for stop in (None, ["b"]):
        stream = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, seed=7,
                                             temperature=1.0, stream=True, stop=stop,
                                             stream_options={"include_usage": True}, logprobs=True)
        text, finish, usage, ids, chunks = "", None, None, [], 0
        for chunk in stream:
            chunks += 1
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                ids += (c.model_extra or {}).get("token_ids") or []
                finish = c.finish_reason or finish
        assert chunks >= 3 and finish in ("stop", "length")
        assert usage is not None and usage.completion_tokens == len(ids)
        assert server.core.generator.text.decode(ids) == text
        if stop:
            assert "b" not in text
        # The same request without streaming gives the same ids (same seed), hence the same text.
        plain = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, seed=7,
                                            temperature=1.0, stop=stop)
        assert plain.choices[0].model_extra["token_ids"] == ids
        assert plain.choices[0].message.content == text


def test_sse_frames_are_real_events(server) -> None:
    with server.client() as http, http.stream("POST", "/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 8, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_control_token_serves_without_recording_and_models(server) -> None:
    with server.client() as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4})
        models = http.get("/v1/models").json()
    assert response.status_code == 200 and response.json()["choices"][0]["token_ids"]
    assert models["data"][0]["id"] and models["data"][0]["max_model_len"] > 0
    assert server.core.status().episodes.claimed == 0


def test_tools_reach_the_chat_template(server) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    with server.client() as http:
        bare = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()
        tooled = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1, "tools": tools}).json()
    backend = server.core.generator.local
    assert "calc" in backend.text.decode(tooled["prompt_token_ids"])
    assert "calc" not in backend.text.decode(bare["prompt_token_ids"])


def test_concurrent_requests_are_batched(server) -> None:
    import concurrent.futures

    def call(i: int) -> int:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                          timeout=60) as http:
            r = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, "seed": i})
            return r.status_code

    before = server.core.worker.stats.batches
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(call, range(16)))
    assert codes == [200] * 16
    batches = server.core.worker.stats.batches - before
    assert batches < 16  # several requests shared a forward pass
