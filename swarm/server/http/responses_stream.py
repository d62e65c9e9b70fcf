"""Server-sent events for ``stream=true`` Responses calls, in the event types the openai SDK parses.

The tokens arrive as for a streamed chat completion and go through the same ``RowStream`` (text held
back until final, split by the reply parsers), so the streamed text is a prefix of the final reply.
Events, each with its ``sequence_number``: ``response.created``, ``response.in_progress``; a
``reasoning`` item with ``response.reasoning_text.delta`` events while the reasoning streams; a
``message`` item (``response.content_part.added``, ``response.output_text.delta`` …
``response.output_text.done``, ``response.content_part.done``); after the generation one
``function_call`` item per parsed call (its arguments in one ``response.function_call_arguments.delta``,
then ``.done``); every item opened with ``response.output_item.added`` and closed with
``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when cut by
``max_output_tokens``) carrying the whole response, whose items are the streamed ones. A failed
generation ends with an ``error`` event and ``response.failed``. Log-probs come with
``response.output_text.done`` and the final response, not with each delta.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from swarm.protocol import ErrorCode
from swarm.protocol.responses import OutputMessage, OutputText, ReasoningItem, ReasoningText
from swarm.server.episodes.completions import Answer
from swarm.server.errors import ApiError
from swarm.server.http.responses import ResponseShape, function_call
from swarm.server.http.streaming import Delta, RowStream, StreamedToken

__all__ = ["stream_response"]

log = logging.getLogger(__name__)


@dataclass
class _Events:
    """Numbers events and frames them as SSE (``event:`` and ``data:`` lines, as OpenAI sends them)."""

    sequence: int = 0

    def __call__(self, type_: str, **fields: Any) -> bytes:
        payload = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {type_}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


@dataclass
class _Items:
    """The open reasoning and message items of the one streamed reply, and the text each has sent."""

    shape: ResponseShape
    event: _Events
    count: int = 0  # items opened so far: the next one's output_index
    reasoning: str | None = None  # None: no reasoning item open
    reasoning_index: int = -1
    content: str | None = None  # None: no message item open
    message_index: int = -1
    closed: list[str] = field(default_factory=list)

    def push(self, delta: Delta) -> Iterator[bytes]:
        if delta.reasoning:
            if self.reasoning is None:
                self.reasoning, self.reasoning_index = "", self.count
                self.count += 1
                yield self._added(self.reasoning_index, ReasoningItem(id=self.shape.reasoning_id, content=[],
                                                                      status="in_progress"))
            self.reasoning += delta.reasoning
            yield self.event("response.reasoning_text.delta", item_id=self.shape.reasoning_id,
                             output_index=self.reasoning_index, content_index=0, delta=delta.reasoning)
        if delta.content:
            yield from self.close_reasoning()
            yield from self._open_message()
            self.content = (self.content or "") + delta.content
            yield self.event("response.output_text.delta", item_id=self.shape.message_id,
                             output_index=self.message_index, content_index=0, delta=delta.content, logprobs=[])

    def close_reasoning(self) -> Iterator[bytes]:
        if self.reasoning is None or "reasoning" in self.closed:
            return
        self.closed.append("reasoning")
        yield self.event("response.reasoning_text.done", item_id=self.shape.reasoning_id,
                         output_index=self.reasoning_index, content_index=0, text=self.reasoning)
        item = ReasoningItem(id=self.shape.reasoning_id, content=[ReasoningText(text=self.reasoning)])
        yield self.event("response.output_item.done", output_index=self.reasoning_index, item=item.model_dump())

    def close_message(self, message: OutputMessage | None) -> Iterator[bytes]:
        """Close the message item (opening it first when the reply's message streamed no text)."""
        if message is None:
            return
        yield from self._open_message()
        part = message.content[0]
        ids = {"item_id": self.shape.message_id, "output_index": self.message_index, "content_index": 0}
        yield self.event("response.output_text.done", **ids, text=part.text,
                         logprobs=[e.model_dump() for e in part.logprobs or ()])
        yield self.event("response.content_part.done", **ids, part=part.model_dump())
        yield self.event("response.output_item.done", output_index=self.message_index, item=message.model_dump())

    def calls(self, answer: Answer) -> Iterator[bytes]:
        for call in answer.replies[0].tool_calls:
            index, self.count = self.count, self.count + 1
            item = function_call(call.id, call.name, call.arguments)
            yield self._added(index, item.model_copy(update={"arguments": "", "status": "in_progress"}))
            yield self.event("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                             delta=call.arguments)
            yield self.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                             name=call.name, arguments=call.arguments)
            yield self.event("response.output_item.done", output_index=index, item=item.model_dump())

    def _open_message(self) -> Iterator[bytes]:
        if self.content is not None:
            return
        self.content, self.message_index = "", self.count
        self.count += 1
        yield self._added(self.message_index, OutputMessage(id=self.shape.message_id, status="in_progress", content=[]))
        yield self.event("response.content_part.added", item_id=self.shape.message_id, output_index=self.message_index,
                         content_index=0, part=OutputText(text="").model_dump())

    def _added(self, index: int, item: Any) -> bytes:
        return self.event("response.output_item.added", output_index=index, item=item.model_dump())


async def stream_response(shape: ResponseShape, row: RowStream, tokens: asyncio.Queue[StreamedToken | None],
                          generation: asyncio.Future[Answer], prompt: list[int],
                          policy_version: int) -> AsyncIterator[bytes]:
    """Yield the events while ``generation`` runs; ``tokens`` ends with ``None`` when it is done.
    Closed before the end (a disconnect), it cancels ``generation``."""
    event = _Events()
    items = _Items(shape, event)
    started = shape.started(policy_version).model_dump()
    try:
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        while (item := await tokens.get()) is not None:
            _, token, logprob, top = item
            delta = row.push(token, logprob, top)
            if delta is not None:
                for frame in items.push(delta):
                    yield frame
    finally:
        if not generation.done():
            generation.cancel()
    try:
        answer = generation.result()
    except Exception as exc:  # the caller's side (ApiError: its code) or a failed generation
        if not isinstance(exc, ApiError):
            log.exception("streamed generation failed")
        code = exc.code.value if isinstance(exc, ApiError) else ErrorCode.internal.value
        message = exc.message if isinstance(exc, ApiError) else f"generation failed: {type(exc).__name__}"
        yield event("error", code=code, message=message, param=None)
        yield event("response.failed", response=shape.failed(policy_version, code, message).model_dump())
        return
    for frame in _finish(items, row, answer, prompt):
        yield frame


def _finish(items: _Items, row: RowStream, answer: Answer, prompt: list[int]) -> Iterator[bytes]:
    gen, reply = answer.sampled.generations[0], answer.replies[0]
    yield from items.push(row.close(gen, reply))
    final = items.shape.finished(prompt, answer)
    yield from items.close_reasoning()
    yield from items.close_message(next((i for i in final.output if isinstance(i, OutputMessage)), None))
    yield from items.calls(answer)
    kind = "response.completed" if final.status == "completed" else "response.incomplete"
    yield items.event(kind, response=final.model_dump())
