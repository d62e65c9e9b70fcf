"""The transport's retry window bounds an unreachable or failing server, never a live server's "retry
later": a run whose server refuses new groups for longer than the window (admission while a real
model's step takes minutes) keeps waiting, while a server that keeps failing still ends the call."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from swarm.client._errors import SwarmUnavailable
from swarm.client._transport import Credential, Transport


class _Scripted(BaseHTTPRequestHandler):
    """Answers each GET with the next (status, retry_after) of the server's script, then 200."""

    def do_GET(self) -> None:
        script: list[tuple[int, float | None]] = self.server.script  # type: ignore[attr-defined]
        status, retry_after = script.pop(0) if script else (200, None)
        body = ({"ok": True} if status == 200 else
                {"error": {"code": "retry_later", "message": "a batch is full", "retry_after": retry_after}})
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    httpd.script = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _transport(httpd: ThreadingHTTPServer, window: float) -> Transport:
    return Transport(f"http://127.0.0.1:{httpd.server_address[1]}", control=Credential("t"), client=Credential(None),
                     timeout=5, retry_for_s=window)


def test_refusals_longer_than_the_window_are_waited_out(server: ThreadingHTTPServer) -> None:
    server.script[:] = [(429, 0.1)] * 12  # type: ignore[attr-defined]
    transport = _transport(server, window=0.5)
    started = time.monotonic()
    assert transport.request("GET", "/api/v1/episodes").json() == {"ok": True}
    assert time.monotonic() - started > 1.0  # twice the window, spent in refusals
    transport.close()


def test_work_done_while_refused_does_not_count_against_the_window(server: ThreadingHTTPServer) -> None:
    """``while_refused`` plays the held-out round the refusal's step waits for: minutes for a real model on
    a busy CPU. That is the server's own pacing at work; a claim that counted it against the window gave up
    ("still failing after 30 s (2 attempts)") while its server was healthy, and stopped the run."""
    server.script[:] = [(429, 0.05)] * 3  # type: ignore[attr-defined]
    transport = _transport(server, window=0.3)
    played: list[float] = []

    def held_out_round(error: Exception) -> None:
        played.append(time.monotonic())
        time.sleep(0.5)  # longer than the whole window

    assert transport.request("GET", "/api/v1/episodes", while_refused=held_out_round).json() == {"ok": True}
    assert len(played) == 3
    transport.close()


def test_a_failing_server_still_ends_the_call_after_the_window(server: ThreadingHTTPServer) -> None:
    server.script[:] = [(500, None)] * 1000  # type: ignore[attr-defined]
    transport = _transport(server, window=0.5)
    with pytest.raises(SwarmUnavailable, match="still failing after 0 s"):
        transport.request("GET", "/api/v1/status")
    transport.close()
