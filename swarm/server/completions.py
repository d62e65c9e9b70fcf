"""One generation path for chat calls: render → generate → record, streaming or not.

``Completions.start`` does everything that can fail because of the caller (an episode that is not
live, messages the chat template rejects, a prompt that leaves no room) *before* any compute, so the
route can still answer with a 4xx; it then starts the generation as a task and returns a
``ChatCall``. The task records the sampled tokens into the episode's trace the moment they exist,
whether or not the HTTP client is still listening (a client that disconnects from a stream cannot
make a finished sample disappear). The OpenAI routes only parse requests and shape responses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.backends.base import Generator, GeneratorUnavailable, Sampled, SamplingParams, TokenSink
from swarm.protocol import ChatCompletionRequest
from swarm.server.errors import BadRequest, ContextTooLong, Unavailable

if TYPE_CHECKING:
    from swarm.server.engine import Engine


@dataclass
class ChatCall:
    """A started chat call: its prompt ids, its sampling params and the running generation."""

    prompt: list[int]
    params: list[SamplingParams]
    result: asyncio.Future[Sampled]


class Completions:
    """Serves chat calls through the engine's generator and records them into episodes."""

    def __init__(self, engine: Engine, generator: Generator, max_context: int) -> None:
        self.engine = engine
        self.generator = generator
        self.max_context = max_context

    def start(self, episode_id: str | None, request: ChatCompletionRequest, sink: TokenSink | None = None) -> ChatCall:
        """Validate and render now (raising the caller's 4xx), then generate in a task. With an
        ``episode_id`` the result is recorded into that episode; without, it is served only."""
        if episode_id is not None:
            self.engine.live(episode_id)  # 404 / 409 / 410 before spending any compute
        if not self.generator.available:
            raise _unavailable(GeneratorUnavailable("the generator is restarting", retry_after=5.0))
        prompt = self._render(request)
        params = self._sampling(request, len(prompt))
        result = asyncio.ensure_future(self._generate(episode_id, prompt, params, sink))
        return ChatCall(prompt=prompt, params=params, result=result)

    async def _generate(self, episode_id: str | None, prompt: list[int], params: list[SamplingParams],
                        sink: TokenSink | None) -> Sampled:
        try:
            sampled = await self.generator.generate([prompt] * len(params), params, sink)
        except ValueError as exc:  # params or prompt the generator cannot serve: the caller's input
            raise BadRequest(str(exc)) from None
        except GeneratorUnavailable as exc:
            raise _unavailable(exc) from None
        if episode_id is not None:
            self.engine.record(episode_id, prompt, sampled.generations, sampled.policy_version, params[0].temperature)
        return sampled

    def _render(self, request: ChatCompletionRequest) -> list[int]:
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        try:
            return list(self.generator.render_prompt(messages, request.tools))
        except Exception as exc:  # the template rejected these messages: the caller's input
            raise BadRequest(f"the chat template cannot render these messages: {exc}") from None

    def _sampling(self, request: ChatCompletionRequest, prompt_len: int) -> list[SamplingParams]:
        config = self.engine.config
        room = self.max_context - prompt_len
        requested = request.max_completion_tokens or request.max_tokens
        if requested is not None and requested > room:
            raise ContextTooLong(
                f"prompt ({prompt_len} tokens) + max_tokens ({requested}) exceeds the model's context of "
                f"{self.max_context} tokens", detail={"prompt_tokens": prompt_len, "max_context": self.max_context})
        if room < 1:
            raise ContextTooLong(f"the prompt ({prompt_len} tokens) fills the model's context of {self.max_context}")
        top = request.top_logprobs or 0
        if top and not self.generator.reports_top_logprobs:
            raise BadRequest(f"top_logprobs > 0 is not supported by the {type(self.generator).__name__} engine; "
                             "use 0 (or --engine vllm)", status=422)
        max_tokens = requested if requested is not None else min(config.max_tokens, room)
        temperature = config.temperature if request.temperature is None else request.temperature
        top_p = config.top_p if request.top_p is None else request.top_p
        stops = tuple(request.stop or ())
        # n > 1 with a seed: distinct but reproducible choices.
        return [SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops,
                               seed=None if request.seed is None else request.seed + i, top_logprobs=top)
                for i in range(request.n)]



def _unavailable(exc: GeneratorUnavailable) -> Unavailable:
    return Unavailable(f"{exc}; no episode is lost: retry this call", retry_after=max(exc.retry_after, 1.0))
