"""OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``.

A call with an episode key is recorded into that episode's trace token-exactly (prompt ids from
the backend's own chat-template rendering, completion ids and log-probs as sampled); a call with the
control token is served without recording. Responses carry vLLM's extra fields
(``prompt_token_ids``, ``choices[i].token_ids``) plus the ``policy_version`` that generated them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from swarm.backends.base import Generation, SamplingParams
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
from swarm.server.batcher import Batch
from swarm.server.context import AppContext, app_context
from swarm.server.errors import BadRequest, ContextTooLong
from swarm.server.streaming import ChunkWriter, RowStream, stream_completion

router = APIRouter()


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, ctx: AppContext = Depends(app_context)) -> ModelList:
    ctx.keys.principal(request)
    card = ModelCard(id=ctx.backend.model_name, created=ctx.engine.created, max_model_len=ctx.max_context)
    return ModelList(data=[card])


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ctx: AppContext = Depends(app_context)) -> Response:
    episode_id = ctx.keys.principal(request).episode_id
    if episode_id is not None:
        ctx.engine.live(episode_id)  # 404 / 409 / 410 before spending any compute
    prompt = _render(ctx, body)
    params = _sampling(ctx, body, len(prompt))
    temperature = params[0].temperature
    prompts = [prompt] * body.n

    def record(future: asyncio.Future[Batch]) -> None:
        if episode_id is not None and not future.cancelled() and future.exception() is None:
            batch = future.result()
            ctx.engine.record(episode_id, prompt, batch.generations, batch.policy_version, temperature)

    if body.stream:
        return _stream(ctx, body, prompts, params, record)
    generation = ctx.worker.submit(prompts, params)
    generation.add_done_callback(record)
    batch = await generation
    # Serialised by pydantic directly: FastAPI's generic encoder costs ~0.2 ms a response.
    return Response(_completion(ctx, body, prompt, batch).model_dump_json(by_alias=True),
                    media_type="application/json")


def _render(ctx: AppContext, body: ChatCompletionRequest) -> list[int]:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        return list(ctx.backend.render_prompt(messages, body.tools))
    except Exception as exc:  # the template rejected these messages: the caller's input
        raise BadRequest(f"the chat template cannot render these messages: {exc}") from None


def _sampling(ctx: AppContext, body: ChatCompletionRequest, prompt_len: int) -> list[SamplingParams]:
    config = ctx.engine.config
    room = ctx.max_context - prompt_len
    requested = body.max_completion_tokens or body.max_tokens
    if requested is not None and requested > room:
        raise ContextTooLong(
            f"prompt ({prompt_len} tokens) + max_tokens ({requested}) exceeds the model's context of "
            f"{ctx.max_context} tokens", detail={"prompt_tokens": prompt_len, "max_context": ctx.max_context})
    if room < 1:
        raise ContextTooLong(f"the prompt ({prompt_len} tokens) fills the model's context of {ctx.max_context}")
    max_tokens = requested if requested is not None else min(config.max_tokens, room)
    temperature = config.temperature if body.temperature is None else body.temperature
    top_p = config.top_p if body.top_p is None else body.top_p
    stops = tuple(body.stop or ())
    # n > 1 with a seed: distinct but reproducible choices.
    return [SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops,
                           seed=None if body.seed is None else body.seed + i) for i in range(body.n)]


def _completion(ctx: AppContext, body: ChatCompletionRequest, prompt: list[int], batch: Batch) -> ChatCompletion:
    choices = [_choice(ctx, i, gen, body.logprobs) for i, gen in enumerate(batch.generations)]
    completion_tokens = sum(len(g.token_ids) for g in batch.generations)
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=ctx.backend.model_name,
        choices=choices, prompt_token_ids=prompt, policy_version=batch.policy_version,
        usage=Usage(prompt_tokens=len(prompt), completion_tokens=completion_tokens,
                    total_tokens=len(prompt) + completion_tokens),
    )


def _choice(ctx: AppContext, index: int, gen: Generation, with_logprobs: bool) -> Choice:
    logprobs = None
    if with_logprobs:
        logprobs = ChoiceLogprobs(content=[TokenLogprob(token=ctx.backend.decode([t]), logprob=lp)
                                           for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)])
    return Choice(index=index, message=AssistantMessage(content=ctx.backend.decode(gen.token_ids)),
                  finish_reason=gen.finish_reason, logprobs=logprobs, token_ids=list(gen.token_ids))


def _stream(ctx: AppContext, body: ChatCompletionRequest, prompts: list[list[int]],
            params: list[SamplingParams], record: Any) -> StreamingResponse:
    tokens: asyncio.Queue[tuple[int, int, float] | None] = asyncio.Queue()

    def sink(row: int, token: int, logprob: float) -> None:
        tokens.put_nowait((row, token, logprob))

    generation = ctx.worker.submit(prompts, params, sink)
    generation.add_done_callback(record)
    generation.add_done_callback(lambda _: tokens.put_nowait(None))
    writer = ChunkWriter(completion_id=f"chatcmpl-{uuid.uuid4().hex}", model=ctx.backend.model_name,
                         policy_version=ctx.engine.policy_version, decode=ctx.backend.decode,
                         with_logprobs=body.logprobs)
    rows = [RowStream(decode=ctx.backend.decode, stops=list(body.stop or ())) for _ in prompts]
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    frames = stream_completion(writer, rows, tokens, generation, len(prompts[0]), include_usage)
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
