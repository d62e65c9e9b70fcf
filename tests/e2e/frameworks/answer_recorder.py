"""A pass-through HTTP proxy on loopback that records the status of every answer it forwards.

The frameworks send through different HTTP stacks (httpx under the openai SDK, aiohttp under litellm,
dspy's own vendored client), so the one place that sees every call of every framework is the wire: an
agent's ``base_url`` points here, each request goes on to the swarm server unchanged and each answer
comes back unchanged, streamed as it arrives. A framework that swallows a 4xx, or an SDK that retried
a 5xx, still leaves it in ``answers``. Use as a context manager (``url`` is valid inside it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from support import wait_for

# Set per connection by each side, never forwarded.
_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te"})


class AnswerRecorder:
    """Forwards every request to ``upstream`` and records ``(method, path, status)`` of each answer."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.answers: list[tuple[str, str, int]] = []
        self.url = ""
        self._client: httpx.AsyncClient | None = None  # made on the server's own event loop (``_lifespan``)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as self._client:
            yield

    async def _forward(self, request: Request) -> StreamingResponse:
        assert self._client is not None, "the recorder's server is not running"
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        outgoing = self._client.build_request(request.method, f"{self.upstream}{request.url.path}",
                                              params=request.query_params, headers=headers,
                                              content=await request.body())
        answer = await self._client.send(outgoing, stream=True)
        self.answers.append((request.method, request.url.path, answer.status_code))
        back = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=back,
                                 background=BackgroundTask(answer.aclose))

    def __enter__(self) -> AnswerRecorder:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=methods)], lifespan=self._lifespan)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # uvicorn serves on this socket: no window for a port race
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        try:
            wait_for(lambda: self._server.started or not self._thread.is_alive(), 30,  # type: ignore[union-attr]
                     what="the answer recorder to start", interval=0.02)
            if not self._server.started:
                raise RuntimeError("the answer recorder's thread ended before it started")
        except BaseException:
            self.__exit__()
            sock.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
