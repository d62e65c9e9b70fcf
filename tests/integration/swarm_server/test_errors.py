"""Every user mistake gets a 4xx with the one error body; none gives a 500."""

from __future__ import annotations

import httpx
import pytest
from server_harness import launch

from swarm.protocol import MAX_BODY_BYTES, ErrorBody

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    running = launch(tiny_model, tmp_path_factory.mktemp("errors"), group_size=2, batch_groups=1000,
                     max_context=256)
    yield running
    running.stop()


def _error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = ErrorBody.model_validate(response.json())
    assert body.error.code.value == code and body.error.message
    return response.json()["error"]


def _claim(http: httpx.Client) -> dict:
    return http.post("/api/v1/episodes", json={"task_id": "t"}).json()


def test_bad_json_and_validation(server) -> None:
    with server.client() as http:
        _error(http.post("/api/v1/episodes", content=b"{not json", headers={"content-type": "application/json"}),
               400, "bad_request")
        _error(http.post("/v1/chat/completions", content=b"[1,", headers={"content-type": "application/json"}),
               400, "bad_request")
        typo = _error(http.post("/api/v1/episodes", json={"task": "typo"}), 400, "bad_request")
        assert "task" in typo["message"]  # an unknown field is named, as OpenAI does
        # An invalid value: a 400 naming its field on the OpenAI routes (as OpenAI answers), 422 on the control API.
        assert "messages" in _error(http.post("/v1/chat/completions", json={"messages": []}), 400, "bad_request")["message"]
        bad = _error(http.post("/v1/chat/completions", json={"messages": MESSAGES, "top_logprobs": 21}), 400, "bad_request")
        assert "top_logprobs" in bad["message"]
        _error(http.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}),
               400, "bad_request")
        _error(http.post("/api/v1/episodes", json={"task_id": "t", "lease_s": -1}), 422, "bad_request")


def test_auth_mistakes(server) -> None:
    with httpx.Client(base_url=server.url) as anon:
        _error(anon.get("/api/v1/status"), 401, "unauthorized")
        _error(anon.post("/v1/chat/completions", json={"messages": MESSAGES},
                         headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
        assert anon.get("/healthz").status_code == 200
    with server.client() as http:
        a, b = _claim(http), _claim(http)
    forged = a["api_key"][:-4] + "0000"
    with server.client(forged) as http:
        _error(http.post("/v1/chat/completions", json={"messages": MESSAGES}), 401, "unauthorized")
    with server.client(a["api_key"]) as http:  # A's key on B
        _error(http.post(f"/api/v1/episodes/{b['episode_id']}/finish", json={"reward": 1.0}), 403, "forbidden")
        _error(http.get("/api/v1/status"), 403, "forbidden")
        _error(http.post("/api/v1/episodes", json={"task_id": "x"}), 403, "forbidden")


def test_episode_mistakes(server) -> None:
    with server.client() as http:
        _error(http.post("/api/v1/episodes/nope/finish", json={"reward": 1.0}), 404, "not_found")
        _error(http.post("/api/v1/episodes/nope/heartbeat"), 404, "not_found")
        episode = _claim(http)
        path = f"/api/v1/episodes/{episode['episode_id']}"
        nan = http.post(f"{path}/finish", content=b'{"reward": NaN}', headers={"content-type": "application/json"})
        _error(nan, 422, "bad_request")
        _error(http.post(f"{path}/finish", json={"reward": "inf"}), 422, "bad_request")
        assert http.get(path).json()["state"] == "claimed"  # the bad finishes changed nothing
        assert http.post(f"{path}/finish", json={"reward": 0.5}).status_code == 200
        assert http.post(f"{path}/finish", json={"reward": 0.5}).status_code == 200  # same body: no-op
        _error(http.post(f"{path}/finish", json={"reward": 0.7}), 409, "conflict")
        _error(http.post(f"{path}/heartbeat"), 409, "conflict")
        _error(http.post(f"{path}/abort", json={"reason": "late"}), 409, "conflict")
        assert http.get(path).json()["reward"] == 0.5
    with server.client(episode["api_key"]) as http:  # a finished episode's key no longer generates
        _error(http.post("/v1/chat/completions", json={"messages": MESSAGES}), 409, "conflict")


def test_context_and_size_mistakes(server) -> None:
    with server.client() as http:
        error = _error(http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 250}),
                       400, "context_length_exceeded")
        assert error["detail"]["max_context"] == 256
        _error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 400}]}),
               400, "context_length_exceeded")
        big = b'{"task_id": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}'
        _error(http.post("/api/v1/episodes", content=big, headers={"content-type": "application/json"}),
               413, "payload_too_large")

        def chunks():
            for _ in range(MAX_BODY_BYTES // 65536 + 2):
                yield b"x" * 65536

        # Streamed without a Content-Length: the middleware counts as it reads.
        _error(http.post("/api/v1/episodes", content=chunks(), headers={"content-type": "application/json"}),
               413, "payload_too_large")


def test_routes_methods_and_config_mistakes(server) -> None:
    with server.client() as http:
        _error(http.get("/api/v1/nothing"), 404, "not_found")
        _error(http.get("/api/v1/episodes"), 405, "bad_request")
        _error(http.post("/api/v1/control/explode"), 422, "bad_request")
        _error(http.patch("/api/v1/config", json={"values": {"lr": -1}}), 400, "bad_request")
        _error(http.patch("/api/v1/config", json={"values": {"no_such_key": 1}}), 400, "bad_request")
        _error(http.patch("/api/v1/config", json={"values": {"min_group_size": 99}}), 400, "bad_request")
        assert http.get("/api/v1/config").json()["version"] == 0  # nothing changed
        _error(http.get("/api/v1/metrics", params={"since_step": -1}), 422, "bad_request")
        _error(http.post("/api/v1/control/sft", json={"examples": []}), 422, "bad_request")
