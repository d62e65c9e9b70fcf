"""OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``.

The routes parse requests and shape responses; the engine does the rest (``Engine.complete``:
render → generate → record). A call with an episode key is recorded into that episode's trace
token-exactly (prompt ids from the server's own chat-template rendering, completion ids and log-probs
as sampled); a call with the control token is served without recording. Responses carry vLLM's extra fields
(``prompt_token_ids``, ``choices[i].token_ids``) plus the ``policy_version`` that generated them.

A client that disconnects before its answer is ready has its generation cancelled, streaming or not:
its rows stop in the generator and free their slots (the engine's in-flight caps count them until then).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from swarm.backends.base import Generation, Sampled
from swarm.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ModelCard,
    ModelList,
    TokenLogprob,
    Usage,
)
from swarm.server.context import AppContext, app_context
from swarm.server.streaming import ChunkWriter, Decode, RowStream, stream_completion

router = APIRouter()

CONTROL_KEY = "control"  # the in-flight cap's key for calls with the control token
CLIENT_CLOSED = 499  # nginx's "client closed request": logged, never read by the client that left


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, ctx: AppContext = Depends(app_context)) -> ModelList:
    ctx.keys.principal(request)
    card = ModelCard(id=ctx.engine.generator.model_name, created=ctx.engine.created, max_model_len=ctx.max_context)
    return ModelList(data=[card])


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ctx: AppContext = Depends(app_context)) -> Response:
    episode_id = ctx.keys.principal(request).episode_id
    key = CONTROL_KEY if episode_id is None else f"episode:{episode_id}"
    if body.stream:
        return await _stream(ctx, key, episode_id, body)
    call = await ctx.engine.complete(key, episode_id, body)
    if not await _answered_before_disconnect(request, call.result):
        return Response(status_code=CLIENT_CLOSED)
    sampled = call.result.result()
    # Serialised by pydantic directly: FastAPI's generic encoder costs ~0.2 ms a response.
    return Response(_completion(ctx, body, call.prompt, sampled).model_dump_json(by_alias=True),
                    media_type="application/json")


def _completion(ctx: AppContext, body: ChatCompletionRequest, prompt: list[int], sampled: Sampled) -> ChatCompletion:
    decode = ctx.engine.generator.decode
    choices = [_choice(decode, i, gen, body.logprobs) for i, gen in enumerate(sampled.generations)]
    completion_tokens = sum(len(g.token_ids) for g in sampled.generations)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=ctx.engine.generator.model_name,
        choices=choices, prompt_token_ids=prompt, policy_version=sampled.policy_version,
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=completion_tokens,
                    total_tokens=len(prompt) + completion_tokens),
    )


def _choice(decode: Decode, index: int, gen: Generation, with_logprobs: bool) -> Choice:
    logprobs = None
    if with_logprobs:
        logprobs = ChoiceLogprobs(content=token_logprobs(decode, gen.token_ids, gen.logprobs, gen.top_logprobs))
    return Choice(index=index, message=AssistantMessage(content=decode(gen.token_ids)),
                  finish_reason=gen.finish_reason, logprobs=logprobs, token_ids=list(gen.token_ids))


def token_logprobs(decode: Decode, ids: list[int], logprobs: list[float],
                   top: list[list[tuple[int, float]]] | None) -> list[TokenLogprob]:
    """OpenAI's per-token log-prob entries, with the top alternatives when the generator gave them."""
    return [TokenLogprob(token=decode([t]), logprob=lp,
                         top_logprobs=[{"token": decode([a]), "logprob": alp, "bytes": None}
                                       for a, alp in (top[i] if top else [])])
            for i, (t, lp) in enumerate(zip(ids, logprobs, strict=True))]


async def _answered_before_disconnect(request: Request, result: asyncio.Future[Sampled]) -> bool:
    """Wait for ``result``; if the client disconnects first (or this request is cancelled), cancel
    it so its rows stop, and say so."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
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


async def _stream(ctx: AppContext, key: str, episode_id: str | None, body: ChatCompletionRequest) -> StreamingResponse:
    tokens: asyncio.Queue[tuple[int, int, float] | None] = asyncio.Queue()

    def sink(row: int, token: int, logprob: float) -> None:
        tokens.put_nowait((row, token, logprob))

    call = await ctx.engine.complete(key, episode_id, body, sink)  # a 4xx raises here, before the stream starts
    call.result.add_done_callback(lambda _: tokens.put_nowait(None))
    generator = ctx.engine.generator
    writer = ChunkWriter(completion_id=f"chatcmpl-{uuid.uuid4().hex}", model=generator.model_name,
                         policy_version=generator.policy_version, decode=generator.decode,
                         with_logprobs=body.logprobs)
    rows = [RowStream(decode=generator.decode, stops=list(body.stop or ())) for _ in call.params]
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    frames = stream_completion(writer, rows, tokens, call.result, len(call.prompt), include_usage)
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
