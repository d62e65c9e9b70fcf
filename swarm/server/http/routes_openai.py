"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/responses`` and ``GET /v1/models``.

The routes parse requests and shape responses; the core does the rest (``Completions.start``:
render → generate → record). A call with an episode key is recorded into that episode's trace
token-exactly (prompt ids from the server's own chat-template rendering, completion ids and log-probs
as sampled); a call with a run key is recorded into the episode its conversation continues or opens
(``swarm.server.episodes.runs``); a call with the control token is served without recording. Responses carry
vLLM's extra fields (``prompt_token_ids``, ``choices[i].token_ids``) plus the ``policy_version`` that
generated them and, when recorded, the ``episode_id`` (also the ``x-swarm-episode`` header).

Model names follow vLLM: an answer's ``model`` is the name its request asked for (or, asking none, the
first served name). ``swarm serve --served-model-name a,b`` (vLLM's flag) fixes the names: ``/v1/models``
lists them and a request naming another model is a 404, so clients that validate names
(llama-index's ``OpenAI``, autogen) can be given one they know, e.g. ``gpt-4o-mini``. Without it the
server keeps its earlier contract: ``/v1/models`` lists the model's own name and a request may name
any model (one model per server; examples and SDK snippets send ``policy``).

``POST /v1/responses`` is the same call: its request is translated to a chat completion
(``swarm.server.http.responses``), served by the same ``Completions.start`` and shaped back into a
response, so the tokens recorded, merged and repaired are exactly chat's.

A client that disconnects before its answer is ready has its generation cancelled, streaming or not:
its rows stop in the generator and free their slots (the server's in-flight caps count them until then).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from swarm.backends.base import Generation, TokenSink, TopAlternatives
from swarm.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ModelCard,
    ModelList,
    Usage,
)
from swarm.protocol.responses import ResponsesRequest
from swarm.server.episodes.completions import Answer, ChatCall
from swarm.server.episodes.runs import SESSION_HEADER
from swarm.server.errors import NotFound
from swarm.server.http.context import AppContext, app_context
from swarm.server.http.replyshape import finish_reason, token_logprobs, wire_tool_call
from swarm.server.http.responses import ResponseShape, chat_request
from swarm.server.http.responses_stream import stream_response
from swarm.server.http.streaming import ChunkWriter, RowStream, StreamedToken, stream_completion
from swarm.text.parsers import ParsedReply, ReplyStream
from swarm.text.templates import ChatText

router = APIRouter()

CONTROL_KEY = "control"  # the in-flight cap's key for calls with the control token
EPISODE_HEADER = "x-swarm-episode"  # names the episode a call was recorded into (also the body's episode_id)
CLIENT_CLOSED = 499  # nginx's "client closed request": logged, never read by the client that left


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, ctx: AppContext = Depends(app_context)) -> ModelList:
    ctx.keys.principal(request)
    root = ctx.core.generator.model_name
    return ModelList(data=[ModelCard(id=name, created=ctx.core.created, max_model_len=ctx.max_context, root=root)
                           for name in ctx.settings.served_model_name or [root]])


def answered_model(ctx: AppContext, request: Request, requested: str | None) -> str:
    """The ``model`` an answer carries: the requested name (vLLM echoes it), else the first served name;
    a 404 for a name outside ``--served-model-name`` (vLLM's answer), after the credential is checked and
    before anything is started."""
    ctx.keys.principal(request)  # a 401 comes first: a caller without a key learns nothing of the names
    served = ctx.settings.served_model_name
    if served and requested is not None and requested not in served:
        raise NotFound(f"The model `{requested}` does not exist: this server serves {', '.join(served)} "
                       "(--served-model-name; GET /v1/models lists them)",
                       detail={"model": requested, "served": served})
    return requested or (served[0] if served else ctx.core.generator.model_name)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ctx: AppContext = Depends(app_context)) -> Response:
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    model = answered_model(ctx, request, body.model)
    if body.stream:
        return await _stream(ctx, request, body, completion_id, model)
    call = await _start(ctx, request, body, completion_id)
    if not await _answered_before_disconnect(request, call.result):
        return Response(status_code=CLIENT_CLOSED)
    answer = call.result.result()
    completion = _completion(ctx, body, call.prompt, answer, completion_id, model)
    completion.episode_id = call.episode_id
    # Serialised by pydantic directly: FastAPI's generic encoder costs ~0.2 ms a response.
    return Response(completion.model_dump_json(by_alias=True), media_type="application/json",
                    headers=_named(call))


async def _start(ctx: AppContext, request: Request, body: ChatCompletionRequest, response_id: str,
                 sink: TokenSink | None = None) -> ChatCall:
    """Start a chat call for the caller's credential: an episode key's calls go to its episode, a run
    key's to the episode it continues or opens (``swarm.server.episodes.runs``; one whose first call fails is
    aborted), the control token's nowhere. The response id then names the episode."""
    session = request.headers.get(SESSION_HEADER)
    episode_id, opened = await ctx.runs.target(ctx.keys.principal(request), body, session)
    key = CONTROL_KEY if episode_id is None else f"episode:{episode_id}"
    try:
        call = await ctx.chat.start(key, episode_id, body, sink)
    except BaseException as exc:
        if opened and episode_id is not None:
            ctx.runs.discard(episode_id, exc)
        raise
    ctx.runs.name(response_id, episode_id)
    return call


def _named(call: ChatCall) -> dict[str, str]:
    """The header that names a recorded call's episode."""
    return {} if call.episode_id is None else {EPISODE_HEADER: call.episode_id}


def _completion(ctx: AppContext, body: ChatCompletionRequest, prompt: list[int], answer: Answer,
                completion_id: str, model: str) -> ChatCompletion:
    text = ctx.core.generator.text
    sampled = answer.sampled
    choices = [_choice(text, i, gen, reply, body.logprobs)
               for i, (gen, reply) in enumerate(zip(sampled.generations, answer.replies, strict=True))]
    completion_tokens = sum(len(g.token_ids) for g in sampled.generations)
    return ChatCompletion(
        id=completion_id, created=int(time.time()), model=model,
        choices=choices, prompt_token_ids=prompt, policy_version=sampled.policy_version,
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=completion_tokens,
                    total_tokens=len(prompt) + completion_tokens),
    )


def _choice(text: ChatText, index: int, gen: Generation, reply: ParsedReply, with_logprobs: bool) -> Choice:
    logprobs = None
    if with_logprobs:
        logprobs = ChoiceLogprobs(content=token_logprobs(text, gen.token_ids, gen.logprobs, gen.top_logprobs))
    message = AssistantMessage(content=reply.content, reasoning_content=reply.reasoning,
                               tool_calls=[wire_tool_call(c) for c in reply.tool_calls])
    return Choice(index=index, message=message, finish_reason=finish_reason(gen, reply), logprobs=logprobs,
                  token_ids=list(gen.token_ids))


async def _answered_before_disconnect(request: Request, result: asyncio.Future[Answer]) -> bool:
    """Wait for ``result``; if the client disconnects first (or this request is cancelled), cancel
    it so its rows stop, and say so."""
    gone = asyncio.ensure_future(_disconnected(request))
    either: set[asyncio.Future[Any]] = {result, gone}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        answered = result.done()
        if not answered:
            result.cancel()
    return answered


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was read already: the server's next message for
    this request is ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _streamed_call(ctx: AppContext, request: Request, body: ChatCompletionRequest,
                         response_id: str) -> tuple[ChatCall, asyncio.Queue[StreamedToken | None]]:
    """Start a call whose tokens go to a queue, ended by ``None`` when the generation is done."""
    tokens: asyncio.Queue[StreamedToken | None] = asyncio.Queue()

    def sink(row: int, token: int, logprob: float, top: TopAlternatives | None) -> None:
        tokens.put_nowait((row, token, logprob, top))

    call = await _start(ctx, request, body, response_id, sink)  # a 4xx raises here, before the stream starts
    call.result.add_done_callback(lambda _: tokens.put_nowait(None))
    return call, tokens


def _row_stream(ctx: AppContext, call: ChatCall, stops: list[str]) -> RowStream:
    return RowStream(decode=ctx.core.generator.text.decode, stops=stops,
                     reply=ReplyStream(tool_parser=call.parsing.tool_parser,
                                       reasoning_parser=call.parsing.reasoning_parser))


def _sse(frames: Any, call: ChatCall) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **_named(call)})


async def _stream(ctx: AppContext, request: Request, body: ChatCompletionRequest,
                  completion_id: str, model: str) -> StreamingResponse:
    call, tokens = await _streamed_call(ctx, request, body, completion_id)
    generator = ctx.core.generator
    writer = ChunkWriter(completion_id=completion_id, model=model,
                         policy_version=generator.policy_version, text=generator.text,
                         with_logprobs=body.logprobs, episode_id=call.episode_id)
    rows = [_row_stream(ctx, call, list(body.stop or ())) for _ in call.params]
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    return _sse(stream_completion(writer, rows, tokens, call.result, len(call.prompt), include_usage), call)


@router.post("/v1/responses", response_model=None)
async def responses(body: ResponsesRequest, request: Request, ctx: AppContext = Depends(app_context)) -> Response:
    """The Responses API over the chat path (module docstring); stateless, as with ``store=false``."""
    model = answered_model(ctx, request, body.model)
    chat = chat_request(body)
    generator = ctx.core.generator
    shape = ResponseShape(body=body, model=model, text=generator.text)
    if chat.stream:
        call, tokens = await _streamed_call(ctx, request, chat, shape.id)
        shape.episode_id = call.episode_id
        return _sse(stream_response(shape, _row_stream(ctx, call, []), tokens, call.result, call.prompt,
                                    generator.policy_version), call)
    call = await _start(ctx, request, chat, shape.id)
    shape.episode_id = call.episode_id
    if not await _answered_before_disconnect(request, call.result):
        return Response(status_code=CLIENT_CLOSED)
    return Response(shape.finished(call.prompt, call.result.result()).model_dump_json(), media_type="application/json",
                    headers=_named(call))
