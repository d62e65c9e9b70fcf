"""Security and schema: control routes refuse callers without the control token, episode keys open
only their own episode, oversize bodies are refused, and a schemathesis fuzz of ``/openapi.json``
finds no 5xx and no response that breaks the published schema. One real server process serves the
whole module (its context is capped at 64 tokens so fuzzed chat requests stay cheap).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from rel_harness import start_server
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from support import ServeProcess, free_port

TOKEN = "security-token"
# Routes an episode key may use (its own episode only) or any key may use; everything else is control.
# Routes an episode key may call (checked apart below: the OpenAI ones validate their body first).
EPISODE_ROUTES = ("/api/v1/episodes/{episode_id}", "/v1/chat/completions", "/v1/responses", "/v1/models", "/healthz")


@pytest.fixture(scope="module")
def live(rel_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    server = start_server(rel_model, tmp_path_factory.mktemp("security") / "state", port=free_port(),
                                 token=TOKEN, config={"group_size": 2, "batch_groups": 4, "max_tokens": 4},
                                 extra_args=("--max-context", "64"))
    yield server
    server.kill()


def _claim(server: ServeProcess, task: str) -> dict:
    with server.http() as http:
        response = http.post("/api/v1/episodes", json={"task_id": task})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _is_error_body(response: httpx.Response) -> bool:
    body = response.json()
    return set(body) == {"error"} and {"code", "message"} <= set(body["error"])


def _control_operations(server: ServeProcess) -> list[tuple[str, str]]:
    """Every (method, concrete path) of the published schema that needs the control token."""
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    operations = []
    for path, methods in paths.items():
        if path.startswith(EPISODE_ROUTES):
            continue
        for method in methods:
            operations.append((method.upper(), path.replace("{action}", "pause")))
    return operations


def test_control_routes_refuse_missing_wrong_and_episode_tokens(live: ServeProcess) -> None:
    operations = _control_operations(live)
    assert {("PATCH", "/api/v1/config"), ("POST", "/api/v1/control/pause"), ("GET", "/api/v1/events"),
            ("POST", "/api/v1/episodes"), ("GET", "/api/v1/status")} <= set(operations)
    episode_key = _claim(live, "auth")["api_key"]
    for action in ("resume", "checkpoint", "stop", "sft"):
        operations.append(("POST", f"/api/v1/control/{action}"))
    for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 401),
                            ({"Authorization": f"Bearer {episode_key}"}, 403)):
        for method, path in operations:
            response = httpx.request(method, f"{live.url}{path}", headers=headers, json={"values": {"lr": 0.5}},
                                     params={"timeout_s": 1})
            assert response.status_code == status, (method, path, headers, response.text)
            assert _is_error_body(response)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/responses", {"input": "hi"})):
        for headers in ({}, {"Authorization": "Bearer wrong"}):  # a valid body without a valid key
            assert httpx.post(f"{live.url}{path}", headers=headers, json=body).status_code == 401, (path, headers)
    status = live.status()  # nothing the refused calls asked for happened
    assert status["state"] == "running" and status["config_version"] == 0


def test_episode_key_opens_only_its_own_episode(live: ServeProcess) -> None:
    mine, other = _claim(live, "a"), _claim(live, "b")
    with live.http(mine["api_key"]) as http:
        for path in ("finish", "heartbeat", "abort"):
            body = {"reward": 1.0} if path == "finish" else None
            refused = http.post(f"/api/v1/episodes/{other['episode_id']}/{path}", json=body)
            assert refused.status_code == 403 and _is_error_body(refused)
        assert http.patch("/api/v1/config", json={"values": {"lr": 0.5}}).status_code == 403
        assert http.get("/api/v1/events", params={"timeout_s": 1}).status_code == 403
        assert http.get(f"/api/v1/episodes/{mine['episode_id']}").json()["state"] == "claimed"
    forged = mine["api_key"].rsplit(".", 1)[0].replace(mine["episode_id"], other["episode_id"]) + ".deadbeef"
    with live.http(forged) as http:
        assert http.post(f"/api/v1/episodes/{other['episode_id']}/finish", json={"reward": 1.0}).status_code == 401
    with live.http() as http:
        assert http.get(f"/api/v1/episodes/{other['episode_id']}").json()["state"] == "claimed"
        assert http.get("/api/v1/config").json()["version"] == 0


def test_oversize_body_is_refused(live: ServeProcess) -> None:
    episode = _claim(live, "big")
    with live.http(episode["api_key"]) as http:
        response = http.post(f"/api/v1/episodes/{episode['episode_id']}/finish",
                             json={"reward": 1.0, "metadata": {"blob": "x" * (5 * 1024 * 1024)}})
        assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
        assert http.get(f"/api/v1/episodes/{episode['episode_id']}").json()["state"] == "claimed"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "stream": True}),
])
def test_streamed_answers_have_a_documented_content_type(live: ServeProcess, path: str, body: dict) -> None:
    """The fuzzer below once drew ``stream: true`` for /v1/responses and met an SSE answer its schema did
    not document; each streaming route is checked here every run rather than by chance."""
    documented = httpx.get(f"{live.url}/openapi.json").json()["paths"][path]["post"]["responses"]["200"]["content"]
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.stream("POST", f"{live.url}{path}", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].split(";")[0] in documented, documented
    assert {"application/json", "text/event-stream"} <= set(documented)


@pytest.mark.slow
def test_rel_fuzz_openapi(live: ServeProcess) -> None:
    """Every operation of the live schema, bounded examples each, with the control token."""
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    # Excluded: `control/{action}` (stop would end the server under test; the actions are covered
    # above and in the server tests), `control/sft` (runs training steps), the endless SSE stream.
    schema = schema.exclude(path_regex=r"^/api/v1/(control/|events)")
    failures: list[str] = []
    tested: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        tested.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  phases=[Phase.explicit, Phase.generate])
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30,
                                   checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                           response_schema_conformance])

        try:
            check()
        except Exception as exc:  # collect every operation's failure, then report them together
            failures.append(f"{operation.label}: {exc}")
    assert len(tested) >= 8, tested
    assert not failures, "\n\n".join(failures)
