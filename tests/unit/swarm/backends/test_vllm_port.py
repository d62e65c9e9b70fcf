"""A vLLM child whose port another server holds is started again on a new port, at once.

vLLM binds its port with SO_REUSEADDR early and listens only once its engine is up, tens of seconds
later; a server another process started in between can hold the same port (a CI run: a swarm server
on port 0 got the vLLM child's port, answered its health checks with 404 for 180 s, and the start
failed). Here a stand-in for vLLM's Python serves ``/health`` on the port it is given, or, when that
port is taken, waits as a starting vLLM does; a real HTTP server holds the first port chosen."""

from __future__ import annotations

import asyncio
import http.server
import sys
import threading
import time
from pathlib import Path

from swarm import ports
from swarm.backends.vllm import VllmProcess

_STAND_IN = """#!/bin/sh
# Stands in for vLLM's Python: serves /health on its --port; a taken port: waits, as vLLM starting up.
port=""
while [ $# -gt 0 ]; do [ "$1" = "--port" ] && port="$2"; shift; done
exec {python} -c '
import http.server, sys, time
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
try:
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
except OSError:
    time.sleep(600)
' "$port"
"""


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_port_another_server_answers_on_is_left_for_a_new_one(tmp_path: Path, monkeypatch) -> None:
    foreign = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    held = foreign.server_address[1]
    chosen, choose = iter([held]), ports.free_port
    monkeypatch.setattr(ports, "free_port", lambda host="127.0.0.1": next(chosen, None) or choose(host))
    stand_in = tmp_path / "python"
    stand_in.write_text(_STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    process = VllmProcess(tmp_path, tmp_path / "vllm.log", python=str(stand_in))
    started = time.monotonic()
    try:
        asyncio.run(process.start(timeout=60))
        assert process.port != held and process.alive()
        assert time.monotonic() - started < 30  # not the whole start timeout on someone else's 404s
    finally:
        asyncio.run(process.stop())
        foreign.shutdown()

