"""Real server-sent events for ``stream=True`` chat completions.

Tokens arrive from the device thread as they are sampled. Text is sent only once it cannot change:
an incomplete UTF-8 sequence, or a tail that could still grow into a stop string, is held back
(the backend cuts a stop string out of the final ids, so streamed text must never show it). The
last chunk of each choice sends whatever the final ids add, so the streamed text always equals the
decode of the returned token ids. With a tool-call or reasoning parser, each choice's text is split
as it streams into ``reasoning_content`` and ``content`` deltas (``parsers.ReplyStream``); text from a
tool-call marker on is held back, and the parsed calls are sent whole in one ``tool_calls`` delta
before the last chunk, so the deltas reassemble to exactly the non-streamed message. Ids whose text is
held back ride on the next chunk with text (or the ``tool_calls`` chunk, or the last), so no chunk
but the last carries an empty ``{}`` delta, while the chunks' ``token_ids`` still add up to every id.
A stream closed early (the client went away) cancels its
generation, so its rows stop in the generator instead of running to ``max_tokens`` for nobody.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from swarm.backends.base import Generation, TopAlternatives
from swarm.protocol import ErrorCode
from swarm.server.episodes.completions import Answer
from swarm.server.errors import ApiError, dumps_error
from swarm.server.http.replyshape import finish_reason, token_logprobs, wire_tool_call
from swarm.text.parsers import ParsedReply, ReplyStream
from swarm.text.templates import ChatText

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


# One streamed token as the sink queues it: (choice index, token id, log-prob, top alternatives or None).
StreamedToken = tuple[int, int, float, "TopAlternatives | None"]


@dataclass
class RowStream:
    """One choice's progress: ids received, how many ids/characters were already sent, and the reply
    view that splits the sent text into reasoning and content (holding tool-call text back)."""

    decode: Decode
    stops: Sequence[str]
    reply: ReplyStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[TopAlternatives | None] = field(default_factory=list)
    sent_ids: int = 0
    sent_text: str = ""

    def push(self, token: int, logprob: float, top: TopAlternatives | None) -> Delta | None:
        """Add a token; return what became final, if anything."""
        self.ids.append(token)
        self.logprobs.append(logprob)
        self.top.append(top)
        cut = stable_length(self.decode(self.ids), self.stops)
        end = len(self.ids)
        while end > self.sent_ids and len(self.decode(self.ids[:end])) > cut:
            end -= 1
        if end <= self.sent_ids:
            return None
        return self._advance(self.decode(self.ids[:end]), end)

    def close(self, gen: Generation, parsed: ParsedReply) -> Delta:
        """The remainder up to the final ids (which the generator may have cut at a stop string),
        split by the final parse."""
        self.ids, self.logprobs = list(gen.token_ids), list(gen.logprobs)
        self.top = list(gen.top_logprobs) if gen.top_logprobs else [None] * len(self.ids)
        delta = self._advance(self.decode(self.ids), len(self.ids), parsed)
        return delta

    def _advance(self, text: str, end: int, parsed: ParsedReply | None = None) -> Delta:
        if not text.startswith(self.sent_text):
            log.warning("streamed text diverged from the final decode; sending the remainder only")
        start = min(self.sent_ids, end)
        self.sent_text, self.sent_ids = text, end
        reasoning, content = self.reply.push(text) if parsed is None else self.reply.finish(parsed)
        return Delta(reasoning=reasoning, content=content, start=start, end=end)


@dataclass
class Delta:
    """What one chunk of a choice carries: new reasoning and content text, and the ids ``[start, end)``."""

    reasoning: str
    content: str
    start: int
    end: int

    def fields(self) -> dict[str, str]:
        delta: dict[str, str] = {}
        if self.reasoning:
            delta["reasoning_content"] = self.reasoning
        if self.content:
            delta["content"] = self.content
        return delta

    def after(self, earlier: Delta | None) -> Delta:
        """This delta preceded by an ``earlier`` one not sent yet (one chunk carries both)."""
        if earlier is None:
            return self
        return Delta(reasoning=earlier.reasoning + self.reasoning, content=earlier.content + self.content,
                     start=earlier.start, end=self.end)


def sse(data: Mapping[str, object] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass
class ChunkWriter:
    """Builds ``chat.completion.chunk`` objects with the fields OpenAI clients expect."""

    completion_id: str
    model: str
    policy_version: int
    text: ChatText
    with_logprobs: bool
    episode_id: str | None = None  # the episode the call is recorded into (each chunk names it)
    created: int = field(default_factory=lambda: int(time.time()))

    def chunk(self, index: int, delta: Mapping[str, object], *, finish: str | None = None,
              row: RowStream | None = None, span: Delta | None = None) -> dict[str, object]:
        choice: dict[str, object] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        if row is not None and span is not None and span.end > span.start:
            ids = row.ids[span.start:span.end]
            choice["token_ids"] = ids
            if self.with_logprobs:
                entries = token_logprobs(self.text, ids, row.logprobs[span.start:span.end], row.top[span.start:span.end])
                choice["logprobs"] = {"content": [e.model_dump() for e in entries]}
        named = {"episode_id": self.episode_id} if self.episode_id is not None else {}
        return {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [choice], "policy_version": self.policy_version, **named}


async def stream_completion(
    writer: ChunkWriter,
    rows: list[RowStream],
    tokens: asyncio.Queue[StreamedToken | None],
    generation: asyncio.Future[Answer],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Yield SSE frames while ``generation`` runs; ``tokens`` ends with ``None`` when it is done.
    Closed before the end (a disconnect), it cancels ``generation``."""
    try:
        for index in range(len(rows)):
            yield sse(writer.chunk(index, {"role": "assistant", "content": ""}))
        pending: list[Delta | None] = [None] * len(rows)  # ids whose text is held back, per choice
        while (item := await tokens.get()) is not None:
            index, token, logprob, top = item
            delta = rows[index].push(token, logprob, top)
            if delta is None:
                continue
            delta = pending[index] = delta.after(pending[index])
            if delta.fields():  # no empty {} deltas: held-back ids ride on the next chunk with text
                pending[index] = None
                yield sse(writer.chunk(index, delta.fields(), row=rows[index], span=delta))
    finally:
        if not generation.done():
            generation.cancel()
    try:
        answer = generation.result()
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
    for index, (row, gen, reply) in enumerate(zip(rows, answer.sampled.generations, answer.replies, strict=True)):
        delta = row.close(gen, reply).after(pending[index])
        completion_tokens += len(gen.token_ids)
        span: Delta | None = delta  # the ids not sent yet go with the first chunk below
        if delta.fields():
            yield sse(writer.chunk(index, delta.fields(), row=row, span=span))
            span = None
        if reply.tool_calls:
            calls = [{"index": k, **wire_tool_call(call).model_dump()} for k, call in enumerate(reply.tool_calls)]
            yield sse(writer.chunk(index, {"tool_calls": calls}, row=row, span=span))
            span = None
        yield sse(writer.chunk(index, {}, finish=finish_reason(gen, reply), row=row, span=span))
    if include_usage:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        yield sse({"id": writer.completion_id, "object": "chat.completion.chunk", "created": writer.created,
                   "model": writer.model, "choices": [], "usage": usage})
    yield sse("[DONE]")
