"""One generation path for chat calls: render → generate → record, streaming or not.

``Completions.start`` does everything that can fail because of the caller (an episode that is not
live, messages too long to tokenise, messages the chat template rejects, a prompt that leaves no
room, a credential or an episode over its bounds) *before* any compute, so the route can still
answer with a 4xx; it then starts the generation as a task and returns a ``ChatCall``. The task
records the sampled tokens into the episode's trace the moment they exist. The OpenAI routes only
parse requests and shape responses; a route whose client went away cancels the task, which stops
its rows in the generator (nothing is recorded for a generation that did not finish).

Bounds, so one request, credential or episode cannot stall or exhaust the server (limits in
``ServerConfig``): a training episode's first chat call passes admission first (it fixes the policy
version the episode's samples carry: 429 if they could not train in time, ``swarm.server.flow.admission``);
the text size is checked before any tokenising (``max_prompt_chars``); rendering runs in a thread,
never on the event loop (``/healthz`` and other clients' heartbeats do not wait on it); a call
holds an ``InFlight`` slot (per credential, and rows in the generation queue) from before rendering
until its generation ends; and an episode's recorded tokens, plus what its running calls may still
add, stay within ``max_episode_tokens``.

A held-out eval episode's calls are served and never recorded (so they reserve no episode tokens).
A call that sends no ``seed`` gets a fixed one, derived from the task id, the call's index in the
episode and the server's seed, so an eval is reproducible for a given policy and seed (up to the batch's
floating-point noise), and the seeds of a study draw fresh held-out noise.
In deterministic and coupled modes (``noise``) every row instead carries a counter-based noise key built
from its episode's task, round, member, call and choice (``swarm.backends.noise``); in deterministic mode
the generator also decodes it batch-invariantly: reproducible exactly, whatever shares the batch.

Rendering follows vLLM's chat route (string tool-call arguments parsed to dicts, ``chat_template_kwargs``
from the server's defaults and the request) and, inside an episode, drift repair: a conversation that
re-sends replies this server produced continues the ids it sampled for them (``swarm.text.drift``).
Every reply is parsed once, as vLLM's ``--tool-call-parser``/``--reasoning-parser`` would
(``swarm.text.parsers``), into the ``Answer`` both the JSON and the streaming routes shape.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from swarm.backends import noise
from swarm.backends.base import (
    Generation,
    Generator,
    GeneratorUnavailable,
    QueueFull,
    Sampled,
    SamplingParams,
    TokenSink,
)
from swarm.backends.noise import KeyedNoise
from swarm.config import PROMPT_CHARS_PER_TOKEN
from swarm.protocol import ChatCompletionRequest, EpisodeState
from swarm.server.call_constraints import call_grammar
from swarm.server.call_sampling import ClientSampling, completion_budget
from swarm.server.episodes.lifecycle import Lifecycle
from swarm.server.errors import BadRequest, Conflict, ContextTooLong, RetryLater, Unavailable
from swarm.server.flow.admission import Admission
from swarm.server.flow.inflight import InFlight
from swarm.server.records.episode import EpisodeRecord
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.view import ServerView
from swarm.text.drift import Conversation
from swarm.text.parsers import ParsedReply, parse_reply, resolve_tool_parser


@dataclass(frozen=True)
class Parsing:
    """How a call's replies are parsed: vLLM's parser names (None: that parser is off for this call)."""

    tool_parser: str | None
    reasoning_parser: str | None
    parallel_tool_calls: bool = True

    def parse(self, text: str) -> ParsedReply:
        return parse_reply(text, tool_parser=self.tool_parser, reasoning_parser=self.reasoning_parser,
                           parallel_tool_calls=self.parallel_tool_calls)


@dataclass
class Answer:
    """A finished generation and each choice's reply as parsed (content, reasoning, tool calls)."""

    sampled: Sampled
    replies: list[ParsedReply]


@dataclass
class Rendered:
    """A call's prompt ids; ``repaired`` when drift repair made them differ from a plain rendering."""

    prompt: list[int]
    conversation_key: bytes | None = None
    repaired: bool = False


@dataclass
class ChatCall:
    """A started chat call: its prompt ids, sampling params, reply parsing, the running generation and
    the episode it is recorded into (if any)."""

    prompt: list[int]
    params: list[SamplingParams]
    parsing: Parsing
    result: asyncio.Future[Answer]
    episode_id: str | None = None


class Completions:
    """Serves chat calls through the generator and records them into the episodes of ``episodes``;
    ``lifecycle.live(episode_id)`` says whether an episode may still take calls (else a 4xx), and
    ``admission.first_call`` admits a training episode's first call."""

    def __init__(self, view: ServerView, *, generator: Generator, max_context: int, episodes: EpisodeRegistry,
                 lifecycle: Lifecycle, admission: Admission, noise: KeyedNoise | None = None, seed: int = 0) -> None:
        self.view = view
        self.seed = seed  # salts held-out episodes' sampling seeds: one run's noise, shared by arms of one seed
        self.noise = noise  # deterministic or coupled mode: every row gets a counter-based noise key
        self.episodes = episodes
        self._lifecycle = lifecycle
        self._admission = admission
        self.generator = generator
        self.max_context = max_context
        self.in_flight = InFlight()
        self.client_sampling = ClientSampling()  # whose temperature/top_p a training call samples with
        self._reserved: Counter[str] = Counter()  # episode id -> tokens its running calls may still record

    async def start(self, key: str, episode_id: str | None, request: ChatCompletionRequest,
                    sink: TokenSink | None = None) -> ChatCall:
        """Validate and render (raising the caller's 4xx), then generate in a task. ``key`` names
        the credential whose in-flight calls are capped. With an ``episode_id`` the result is
        recorded into that episode; without, it is served only."""
        episode = self._lifecycle.live(episode_id) if episode_id is not None else None  # 404/409/410 first
        if episode is not None and not episode.is_eval and episode.calls_started == 0:
            self._admission.first_call(episode.client_id)  # it fixes the episode's version: 429 if it could not train in time
            episode.first_call_at = self.view.clock()
        if not self.generator.available:
            raise _unavailable(GeneratorUnavailable("the generator is restarting", retry_after=5.0))
        self._check_size(request)
        config = self.view.config
        grammar = call_grammar(request, config.tool_call_parser, self.generator.text)  # a 400 before any compute
        releases = [self.in_flight.enter(key, request.n, per_key=config.max_inflight_per_key,
                                         max_rows=config.max_batch_rows + config.max_queued_rows)]
        try:
            rendered = await asyncio.to_thread(self._render, request, episode)
            prompt = rendered.prompt
            seed = request.seed
            if episode is not None and episode.is_eval and seed is None:
                seed = eval_seed(episode.task_id, episode.calls_started, self.seed, episode.place.member)
            params = self._noise_keys(self._sampling(request, len(prompt), seed, episode), episode, prompt, request.seed)
            params = [replace(p, grammar=grammar) for p in params] if grammar is not None else params
            if episode is not None and not episode.is_eval:  # an eval call is served, never recorded
                releases.append(self._reserve_tokens(episode.episode_id, len(prompt), params))
            if episode is not None:
                episode.calls_started += 1
        except BaseException:
            _release_all(releases)
            raise
        parsing = self._parsing(request)
        result = asyncio.ensure_future(self._generate(episode_id, rendered, params, parsing, sink))
        result.add_done_callback(lambda _: _release_all(releases))
        return ChatCall(prompt=prompt, params=params, parsing=parsing, result=result, episode_id=episode_id)

    def _noise_keys(self, params: list[SamplingParams], episode: EpisodeRecord | None, prompt: list[int],
                    request_seed: int | None) -> list[SamplingParams]:
        """In deterministic or coupled mode, each row's ``noise_key`` from its place in the work (what the
        key holds and why: ``swarm.backends.noise``); otherwise ``params`` as they are."""
        if self.noise is None:
            return params
        row: tuple[str | int, ...]
        if episode is None:
            row = ("call", hashlib.blake2b(repr(prompt).encode(), digest_size=16).hexdigest())
        elif episode.is_eval:
            member = episode.place.member
            row = ("eval", episode.task_id, episode.calls_started, *([member] if member else []))
        else:
            row = ("train", episode.task_id, episode.place.task_round, episode.place.member, episode.calls_started)
        return [replace(p, noise_key=noise.sample_key(self.noise.seed, *row, choice, request_seed),
                        batch_invariant=self.noise.batch_invariant) for choice, p in enumerate(params)]

    def _check_size(self, request: ChatCompletionRequest) -> None:
        """Refuse text that cannot fit before paying to tokenise it (a 4 MB message took 14 s)."""
        limit = self.view.config.max_prompt_chars or PROMPT_CHARS_PER_TOKEN * self.max_context
        chars = _text_chars([m.model_dump(exclude_none=True) for m in request.messages]) + _text_chars(request.tools)
        if chars > limit:
            raise ContextTooLong(
                f"the messages and tools hold {chars} characters, more than this server accepts in one call "
                f"({limit}, max_prompt_chars; the model's context is {self.max_context} tokens): shorten the prompt",
                detail={"prompt_chars": chars, "max_prompt_chars": limit, "max_context": self.max_context})

    def _reserve_tokens(self, episode_id: str, prompt_len: int, params: list[SamplingParams]) -> Callable[[], None]:
        """Hold room in the episode's token budget for everything this call could record."""
        episode = self._lifecycle.live(episode_id)  # it may have ended while the prompt rendered
        cap = self.view.config.max_episode_tokens
        recorded, running = episode.trace.tokens, self._reserved[episode_id]
        adds = sum(prompt_len + p.max_tokens for p in params)
        if recorded + running + adds > cap:
            raise Conflict(
                f"episode {episode_id} has recorded {recorded} tokens ({running} more may come from its running "
                f"calls); this call could add {adds} (prompt {prompt_len} + max_tokens {params[0].max_tokens}, "
                f"x n={len(params)}), beyond the limit of {cap} tokens an episode may record (max_episode_tokens): "
                "finish this episode and claim a new one",
                detail={"recorded_tokens": recorded, "running_tokens": running, "call_tokens": adds,
                        "max_episode_tokens": cap})
        self._reserved[episode_id] += adds

        def release() -> None:
            self._reserved[episode_id] -= adds
            if self._reserved[episode_id] <= 0:
                del self._reserved[episode_id]

        return release

    async def _generate(self, episode_id: str | None, rendered: Rendered, params: list[SamplingParams],
                        parsing: Parsing, sink: TokenSink | None) -> Answer:
        prompt = rendered.prompt
        try:
            sampled = await self.generator.generate([prompt] * len(params), params, sink, affinity=episode_id)
        except ValueError as exc:  # params or prompt the generator cannot serve: the caller's input
            raise BadRequest(str(exc)) from None
        except GeneratorUnavailable as exc:
            raise _unavailable(exc) from None
        except QueueFull as exc:
            raise RetryLater(f"{exc}; retry shortly", retry_after=exc.retry_after) from None
        replies = [parsing.parse(self.generator.text.decode(g.token_ids)) for g in sampled.generations]
        if episode_id is not None:
            self.record(episode_id, prompt, sampled.generations, sampled.policy_version, params[0].temperature,
                               replies=replies, conversation_key=rendered.conversation_key,
                               repaired=rendered.repaired, source=sampled.source,
                               constrained=params[0].grammar is not None)
        return Answer(sampled=sampled, replies=replies)

    def record(self, episode_id: str, prompt: list[int], generations: list[Generation], version: int,
               temperature: float, *, replies: Sequence[ParsedReply] = (), conversation_key: bytes | None = None,
               repaired: bool = False, source: str | None = None, constrained: bool = False) -> None:
        """Add one chat call to the episode's trace (a call that raced a finish/expiry is ignored) and
        its replies to the episode's reply book (drift repair of the next call); an eval episode's
        calls are never recorded, only its lease is renewed and its replies kept for repair.
        ``constrained``: the tokens were sampled under a grammar (the trace marks them)."""
        episode = self.episodes.held(episode_id)
        if episode is None or episode.state is not EpisodeState.claimed:
            return
        episode.claim.renew(self.view.clock())  # a chat call is a sign of life
        if conversation_key is not None:
            for reply, generation in zip(replies, generations, strict=True):
                episode.replies.add(conversation_key, reply, prompt + list(generation.token_ids))
        if episode.is_eval:
            return
        episode.generated_by(source)
        episode.trace.record(prompt, [(g.token_ids, g.logprobs) for g in generations], version, temperature,
                             constrained=constrained)
        episode.trace.note_replies(replies, repaired=repaired)

    def _render(self, request: ChatCompletionRequest, episode: EpisodeRecord | None) -> Rendered:
        """The call's prompt ids: the template's rendering, or inside an episode the ids of the
        longest known reply it re-sends plus the template's rendering of what follows it."""
        text = self.generator.text
        try:
            talk = Conversation(request, self.view.config.chat_template_kwargs)
            plain = text.render(talk.messages, talk.tools, talk.kwargs, talk.ending)
            if episode is None:
                return Rendered(prompt=plain)
            splice = talk.splice(episode.replies)
            tail = (text.render_tail(talk.messages, talk.tools, talk.kwargs, splice.index, talk.ending)
                    if splice is not None else None)
        except ValueError as exc:  # the template rejected these messages: the caller's input
            raise BadRequest(f"the chat template cannot render these messages: {exc}") from None
        if splice is None or tail is None:
            return Rendered(prompt=plain, conversation_key=talk.keys[-1])
        if tail and splice.tokens and tail[0] == splice.tokens[-1]:
            tail = tail[1:]  # the reply's own end-of-turn token, sampled already
        prompt = splice.tokens + tail
        return Rendered(prompt=prompt, conversation_key=talk.keys[-1], repaired=prompt != plain)

    def _parsing(self, request: ChatCompletionRequest) -> Parsing:
        config = self.view.config
        calls = bool(request.tools) and request.tool_choice != "none"
        tool_parser = resolve_tool_parser(config.tool_call_parser, self.generator.text.chat_template) if calls else None
        return Parsing(tool_parser=tool_parser, reasoning_parser=config.reasoning_parser,
                       parallel_tool_calls=request.parallel_tool_calls)

    def _sampling(self, request: ChatCompletionRequest, prompt_len: int, seed: int | None,
                  episode: EpisodeRecord | None) -> list[SamplingParams]:
        """Each choice's params: the completion length and temperature/top_p as ``swarm.server.call_sampling``
        chooses them, the request's other options as sent."""
        config = self.view.config
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
                             "use 0 (or --engine vllm)")
        max_tokens = completion_budget(requested, config.max_tokens, room)
        temperature, top_p = self.client_sampling.choose(request, config, episode)
        stops = tuple(request.stop or ())
        extensions = _extensions(request)
        # n > 1 with a seed: distinct but reproducible choices.
        return [SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stops,
                               seed=None if seed is None else seed + i, top_logprobs=top, **extensions)
                for i in range(request.n)]


def _extensions(request: ChatCompletionRequest) -> dict[str, Any]:
    """vLLM's sampling extensions a request set, as ``SamplingParams`` fields (vLLM's -1 top_k is 0: off)."""
    values: dict[str, Any] = {
        "top_k": max(request.top_k, 0) if request.top_k is not None else None,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "min_tokens": request.min_tokens,
        "stop_token_ids": tuple(request.stop_token_ids) if request.stop_token_ids else None,
        "ignore_eos": request.ignore_eos or None,
        "logit_bias": tuple(sorted(request.logit_bias.items())) if request.logit_bias else None,
    }
    return {key: value for key, value in values.items() if value is not None}


def eval_seed(task_id: str, call_index: int, server_seed: int = 0, sample: int = 0) -> int:
    """The fixed sampling seed of an eval episode's ``call_index``-th call on ``task_id`` in a server of
    ``server_seed``: the same held-out task draws the same random numbers under every policy of that seed
    (every round, and the arms of a study that share the seed), and fresh ones under another seed, so a
    study's seeds replicate the held-out sampling noise rather than all reading one frozen draw of it
    (and ``seed + n`` stays int64). ``sample``: the task's n-th eval episode in the round draws its own."""
    parts = [task_id, str(call_index), str(server_seed)] + ([str(sample)] if sample else [])
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _unavailable(exc: GeneratorUnavailable) -> Unavailable:
    return Unavailable(f"{exc}; no episode is lost: retry this call", retry_after=max(exc.retry_after, 1.0))


def _release_all(releases: list[Callable[[], None]]) -> None:
    while releases:
        releases.pop()()


def _text_chars(value: Any) -> int:
    """Characters in every string (keys included) of a JSON-like value; iterative, so deep nesting
    cannot overflow the stack."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total
