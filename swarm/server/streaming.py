"""Real server-sent events for ``stream=True`` chat completions.

Tokens arrive from the device thread as they are sampled. Text is sent only once it cannot change:
an incomplete UTF-8 sequence, or a tail that could still grow into a stop string, is held back
(the backend cuts a stop string out of the final ids, so streamed text must never show it). The
last chunk of each choice sends whatever the final ids add, so the streamed text always equals the
decode of the returned token ids. A stream closed early (the client went away) cancels its
generation, so its rows stop in the generator instead of running to ``max_tokens`` for nobody.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarm.backends.base import Sampled
from swarm.protocol import ErrorCode
from swarm.server.errors import ApiError, dumps_error

log = logging.getLogger(__name__)

Decode = Callable[[Sequence[int]], str]


def stable_length(text: str, stops: Sequence[str]) -> int:
    """How much of ``text`` is final: before any stop string and any tail that may start one."""
    cut = len(text)
    while cut > 0 and text[cut - 1] == "\ufffd":  # an incomplete multi-byte character
        cut -= 1
    for stop in stops:
        found = text.find(stop)
        if found >= 0:
            cut = min(cut, found)
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                cut = min(cut, len(text) - size)
                break
    return cut


@dataclass
class RowStream:
    """One choice's progress: ids received, and how many ids/characters were already sent."""

    decode: Decode
    stops: Sequence[str]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sent_ids: int = 0
    sent_text: str = ""

    def push(self, token: int, logprob: float) -> tuple[str, int, int] | None:
        """Add a token; return (new text, first id, end id) once some text became final."""
        self.ids.append(token)
        self.logprobs.append(logprob)
        cut = stable_length(self.decode(self.ids), self.stops)
        end = len(self.ids)
        while end > self.sent_ids and len(self.decode(self.ids[:end])) > cut:
            end -= 1
        if end <= self.sent_ids:
            return None
        return self._advance(self.decode(self.ids[:end]), end)

    def close(self, final_ids: list[int], final_logprobs: list[float]) -> tuple[str, int, int]:
        """The remainder up to the final ids (which the backend may have cut at a stop string)."""
        self.ids, self.logprobs = list(final_ids), list(final_logprobs)
        return self._advance(self.decode(final_ids), len(final_ids))

    def _advance(self, text: str, end: int) -> tuple[str, int, int]:
        if not text.startswith(self.sent_text):
            log.warning("streamed text diverged from the final decode; sending the remainder only")
        delta = text[len(self.sent_text):]
        start = min(self.sent_ids, end)
        self.sent_text, self.sent_ids = text, end
        return delta, start, end


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass
class ChunkWriter:
    """Builds ``chat.completion.chunk`` objects with the fields OpenAI clients expect."""

    completion_id: str
    model: str
    policy_version: int
    decode: Decode
    with_logprobs: bool
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, index: int, delta: dict[str, Any], *, finish: str | None = None,
              ids: Sequence[int] = (), logprobs: Sequence[float] = ()) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        if ids:
            choice["token_ids"] = list(ids)
            if self.with_logprobs:
                choice["logprobs"] = {"content": [
                    {"token": self.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(ids, logprobs, strict=True)
                ]}
        return {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [choice], "policy_version": self.policy_version}


async def stream_completion(
    writer: ChunkWriter,
    rows: list[RowStream],
    tokens: asyncio.Queue[tuple[int, int, float] | None],
    generation: asyncio.Future[Sampled],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Yield SSE frames while ``generation`` runs; ``tokens`` ends with ``None`` when it is done.
    Closed before the end (a disconnect), it cancels ``generation``."""
    try:
        for index in range(len(rows)):
            yield sse(writer.chunk(index, {"role": "assistant", "content": ""}))
        while (item := await tokens.get()) is not None:
            index, token, logprob = item
            advanced = rows[index].push(token, logprob)
            if advanced is not None:
                text, start, end = advanced
                row = rows[index]
                yield sse(writer.chunk(index, {"content": text}, ids=row.ids[start:end],
                                       logprobs=row.logprobs[start:end]))
    finally:
        if not generation.done():
            generation.cancel()
    try:
        batch = generation.result()
    except ApiError as exc:  # the caller's side (a full queue while it waited): its code and message
        yield sse(dumps_error(exc.code, exc.message))
        yield sse("[DONE]")
        return
    except Exception as exc:  # generation failed: tell the client inside the stream
        log.exception("streamed generation failed")
        yield sse(dumps_error(ErrorCode.internal, f"generation failed: {type(exc).__name__}"))
        yield sse("[DONE]")
        return
    completion_tokens = 0
    for index, (row, gen) in enumerate(zip(rows, batch.generations, strict=True)):
        text, start, end = row.close(gen.token_ids, gen.logprobs)
        completion_tokens += len(gen.token_ids)
        if text or end > start:
            yield sse(writer.chunk(index, {"content": text}, ids=gen.token_ids[start:end],
                                   logprobs=gen.logprobs[start:end]))
        yield sse(writer.chunk(index, {}, finish=gen.finish_reason))
    if include_usage:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        yield sse({"id": writer.completion_id, "object": "chat.completion.chunk", "created": writer.created,
                   "model": writer.model, "choices": [], "usage": usage})
    yield sse("[DONE]")
