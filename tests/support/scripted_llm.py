"""A scripted LLM for planner tests: a real OpenAI-protocol server on loopback with answers set per step.

The researcher's LLM planner talks to any OpenAI-compatible endpoint, so its tests stand up a real
one (FastAPI + uvicorn on 127.0.0.1, an OS-chosen port) instead of faking the SDK. Each request is
answered by the step it belongs to: the first line of the planner's prompt (the second message) is
``# Step: <heading>`` (``prompts/<step>.md``), and the script maps a heading prefix to the answers
for that step, consumed in order with the last one repeated::

    script = {"frame the research topic": ["not json", FRAMING], "plan the experiments": [PLAN]}
    with ScriptedLLM(script, structured=False) as llm:
        LLMSettings(base_url=llm.url, model="scripted")
        ...
        assert llm.steps[0] == "frame the research topic"

An answer is the message text (a ``str``), any other JSON value (sent as its JSON text), or a
callable that gets the request body and returns either. The script may also be one callable for
every request. A repair round (the planner's follow-up in the same conversation) carries the same
step heading, so it takes the step's next answer. Every request is recorded in ``requests``.

``structured=False`` makes the server refuse ``response_format`` with a 400 (``refusal=422``: a 422,
as the swarm server's validation answers), as some servers do, so the planner falls back to JSON in
the prompt; refused requests are recorded but consume no answer. A ``Slow(seconds, answer)`` answer
is sent after that long (a slow local model): the server keeps answering other requests meanwhile,
and one whose client gave up is dropped when the server stops. A request for a step the script does
not know is a 400 naming the step, so a test fails loudly.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from support import wait_for

Answer = Any  # str (the message text), any other JSON value (its JSON text), or Callable[[dict], str | JSON]
Script = Mapping[str, Sequence[Answer] | Callable[[dict[str, Any]], Any]] | Callable[[dict[str, Any]], Any]

USAGE = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}
HEADING = "# Step: "
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Slow:
    """An answer sent ``seconds`` after its request came (the server answers other requests meanwhile)."""

    seconds: float
    answer: Any


def step_of(body: dict[str, Any]) -> str:
    """The step heading of a chat request (``frame the research topic``); ``""`` if it has none."""
    messages = body.get("messages") or []
    prompt = messages[1].get("content") if len(messages) > 1 else None
    first = prompt.splitlines()[0] if isinstance(prompt, str) and prompt else ""
    return first[len(HEADING):].strip() if first.startswith(HEADING) else ""


class ScriptedLLM:
    """The scripted server; use as a context manager (``url`` is valid inside it)."""

    def __init__(self, script: Script, *, structured: bool = True, refusal: int = 400) -> None:
        self.structured = structured
        self.refusal = refusal
        self._closing = False
        self.requests: list[dict[str, Any]] = []
        self._whole = script if callable(script) else None
        self._answers: dict[str, Sequence[Answer] | Callable[[dict[str, Any]], Any]] = (
            {} if callable(script) else dict(script))
        self._used: dict[str, int] = {}
        self._lock = threading.RLock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    @property
    def steps(self) -> list[str]:
        """The step heading of every request so far, in order (refused ones included)."""
        return [step_of(body) for body in self.requests]

    def answer(self, step: str, *answers: Answer) -> None:
        """From now on answer ``step`` with ``answers`` (in order, the last repeated), from the first."""
        if not answers:
            raise ValueError(f"answer({step!r}) needs at least one answer")
        with self._lock:
            self._answers[step] = list(answers)
            self._used[step] = 0

    # ------------------------------------------------------------------ answering

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """The HTTP status and JSON body the server sends for one ``/chat/completions`` request, and the
        seconds it waits before sending them."""
        with self._lock:
            self.requests.append(body)
            number = len(self.requests)
            if body.get("response_format") and not self.structured:
                return self.refusal, _error("response_format json_schema is not supported",
                                            param="response_format"), 0.0
            step = step_of(body)
            try:
                answer = self._next(step, body)
            except LookupError as exc:
                return 400, _error(str(exc)), 0.0
        delay = 0.0
        if isinstance(answer, Slow):
            delay, answer = answer.seconds, answer.answer
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return 200, {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
                     "model": body.get("model", "scripted"), "usage": USAGE,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": text}}]}, delay

    def _next(self, step: str, body: dict[str, Any]) -> Any:
        if self._whole is not None:
            return self._whole(body)
        key = next((k for k in self._answers if step.startswith(k)), None)
        if key is None:
            raise LookupError(f"the script has no answer for step {step!r} (scripted steps: {sorted(self._answers)})")
        answers = self._answers[key]
        if callable(answers):
            return answers(body)
        index = min(self._used.get(key, 0), len(answers) - 1)
        self._used[key] = index + 1
        answer = answers[index]
        return answer(body) if callable(answer) else answer

    # ------------------------------------------------------------------ the server

    def __enter__(self) -> ScriptedLLM:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            status, payload, delay = self.reply(await request.json())
            until = time.monotonic() + delay
            while time.monotonic() < until and not self._closing:  # a stopping server drops a slow answer
                await asyncio.sleep(min(0.05, until - time.monotonic()))
            return JSONResponse(payload, status_code=status)

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # uvicorn serves on (and closes) this socket: no window for a port race
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        try:
            wait_for(lambda: self._server.started or not self._thread.is_alive(), START_TIMEOUT_S,
                     what="the scripted LLM server to start", interval=0.02)
            if not self._server.started:
                raise RuntimeError("the scripted LLM server's thread ended before it started")
        except BaseException:
            self.__exit__(None, None, None)
            sock.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


def _error(message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None, "param": param}}
