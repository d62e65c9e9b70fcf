"""The daemon's HTTP face: a study's event log as Server-Sent Events, for tools other than a terminal.

``GET /studies/{study_id}/events`` streams ``text/event-stream``: every event of the study's log
(``researcher.study.events``) as one SSE message whose ``id:`` is the event id and whose ``data:`` is the
event's JSON (its ``kind`` inside; no ``event:`` field, so a browser's ``onmessage`` sees them all),
then new events as they are appended, with a ``: ping`` comment every ``ping_s`` of silence. A
client that reconnects with ``Last-Event-ID: N`` gets exactly the events after N: the log's ids
only increase, so nothing is skipped or sent twice.

Loopback only (the server binds 127.0.0.1 and refuses other peers) and token-protected: a bearer
token kept in ``<artifacts root>/daemon.token`` (mode 0600, created on first start, reused after).
Wrong or missing token: 401 (before anything about the study is said); unknown study: 404.
``GET /healthz`` answers without a token. The daemon writes where it listens to ``daemon.json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from researcher.study.events import Follower, events_path
from researcher.study.layout import StudyLayout, check_study_id

log = logging.getLogger(__name__)
__all__ = ["ADDRESS_FILE", "TOKEN_FILE", "EventServer", "create_app", "ensure_token"]

TOKEN_FILE = "daemon.token"
ADDRESS_FILE = "daemon.json"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def ensure_token(artifacts_root: Path) -> str:
    """The daemon's bearer token: read from ``daemon.token``, or created there (0600) if missing."""
    path = artifacts_root / TOKEN_FILE
    artifacts_root.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"{path} is empty: delete it and the daemon makes a new token") from None
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)  # a token others can read protects nothing
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "detail": None}}, status_code=status)


def create_app(studies_root: Path, artifacts_root: Path, token: str, *, poll_s: float = 0.25,
               ping_s: float = 15.0, closing: threading.Event | None = None) -> FastAPI:
    """The app; streams end when ``closing`` is set (the daemon shutting down), so none is cut mid-event."""
    closing = closing or threading.Event()
    app = FastAPI(title="researcher daemon", docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/studies/{study_id}/events", response_model=None)
    async def study_events(study_id: str, request: Request) -> StreamingResponse | JSONResponse:
        if request.client is None or request.client.host not in _LOOPBACK:
            return _error(403, "forbidden", "loopback clients only")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
            return _error(401, "unauthorized", f"send Authorization: Bearer <the token in {TOKEN_FILE}>")
        try:
            layout = StudyLayout(check_study_id(study_id), studies_root, artifacts_root)
        except ValueError:
            return _error(404, "not_found", f"no study {study_id!r}")
        path = events_path(layout)
        if not (path.exists() or layout.study_toml.is_file() or layout.graph_db.is_file()):
            return _error(404, "not_found", f"no study {study_id!r}")
        last = request.headers.get("last-event-id", "").strip() or "0"
        if not last.isdigit():
            return _error(400, "bad_request", f"Last-Event-ID must be an event id, got {last!r}")
        return StreamingResponse(_stream(request, Follower(path, int(last)), poll_s, ping_s, closing),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


async def _stream(request: Request, follower: Follower, poll_s: float, ping_s: float,
                  closing: threading.Event) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    quiet_since = time.monotonic()
    while not closing.is_set() and not await request.is_disconnected():
        batch = follower.poll()
        for event in batch:
            yield f"id: {event['id']}\ndata: {json.dumps(event, default=str, ensure_ascii=False)}\n\n"
        if batch:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= ping_s:
            yield ": ping\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(poll_s)


class EventServer:
    """The app served by uvicorn on a thread beside the scheduler, on a loopback socket bound up front
    (so the port is known before serving; port 0 picks a free one, and so does a busy default port)."""

    def __init__(self, studies_root: Path, artifacts_root: Path, port: int, *, fallback: bool = True) -> None:
        import uvicorn

        self.token = ensure_token(artifacts_root)
        self.socket = _bind(port, fallback)
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closing = threading.Event()
        app = create_app(studies_root, artifacts_root, self.token, closing=self._closing)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                                    timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.socket]},
                                        name="events-http", daemon=True)
        self.address_file = artifacts_root / ADDRESS_FILE
        self.token_file = artifacts_root / TOKEN_FILE

    def start(self) -> None:
        self._thread.start()
        self.address_file.write_text(json.dumps({"url": self.url, "port": self.port, "pid": os.getpid(),
                                                 "token_file": str(self.token_file)}) + "\n")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._closing.set()
        self._server.should_exit = True
        self._thread.join(timeout_s)


def _bind(port: int, fallback: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        if not (fallback and port):
            sock.close()
            raise
        log.warning("port %d is busy (%s); serving study events on a free port instead (see %s)", port, exc,
                    ADDRESS_FILE)
        sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.set_inheritable(False)
    return sock
