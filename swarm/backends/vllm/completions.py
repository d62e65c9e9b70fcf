"""One row as a vLLM ``/v1/completions`` request: validation, the request body, reading the answer.

The body asks for token ids in (``prompt: [ids]``) and out (``return_token_ids``), the sampled
token's log-prob (``logprobs: k`` returns it plus the k most likely; ``return_tokens_as_token_ids``
keys those by id, not by text that may collide), the end-of-turn ids the torch engine stops on plus
the row's own ``stop_token_ids`` (``stop_token_ids``; with ``ignore_eos`` only the row's own) and a
-100 logit bias on ids past the tokenizer (embedding padding, which the torch engine never samples),
plus the row's own ``logit_bias``. A constrained row's grammar goes as ``structured_outputs.grammar``
(vLLM 0.32's field; served by the llguidance backend the process is started with), so vLLM masks the
same ids as the torch engine and its processed log-probs are those of the masked distribution.
vLLM's sampling extensions (``top_k``, ``min_p``, the penalties, ``min_tokens``, ``ignore_eos``) go
under vLLM's names, and only when a row sets them, so a plain row's body stays as it was. The server
runs with ``--logprobs-mode processed_logprobs``: log-probs are those of the distribution vLLM drew
from, after penalties, temperature and truncation, as the torch engine records them. A streamed
answer is read chunk by chunk into the same ``RowState`` as a whole answer, so both paths produce
identical ids.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import httpx

from swarm.backends.base import FinishReason, Generation, SamplingParams, TokenSink
from swarm.backends.vllm.chat import cut_at_stop, releasable
from swarm.backends.vllm.errors import GeneratorUnavailable
from swarm.text.constraints import compact

__all__ = ["RowState", "completion_body", "raise_for_status", "sse_payloads"]

PAD_BIAS = -100.0  # the most negative bias vLLM accepts; exp(-100) is below float32 resolution
_TOKEN_PREFIX = "token_id:"


def completion_body(prompt: Sequence[int], p: SamplingParams, *, stream: bool, eos_ids: Sequence[int],
                    padding_ids: range) -> dict[str, object]:
    """vLLM's ``/v1/completions`` body for one row; ``ValueError`` for a row with a ``noise_key``: vLLM
    draws from its own per-request streams, so counter-based noise (``--deterministic``) is the torch
    engine's only."""
    if p.noise_key is not None:
        raise ValueError("counter-based sampling noise (noise_key, swarm serve --deterministic) needs the torch "
                         "engine; vLLM draws from its own per-request streams")
    body: dict[str, object] = {
        "model": "policy",
        "prompt": [int(t) for t in prompt],
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "logprobs": p.top_logprobs,  # 0 still returns the sampled token's log-prob
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stop_token_ids": sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))),
        "skip_special_tokens": True,
        "stream": stream,
    }
    body.update(_extensions(p))
    if p.stop:
        body["stop"] = list(p.stop)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.grammar is not None:
        body["structured_outputs"] = {"grammar": compact(p.grammar)}  # vLLM's llguidance: compact JSON
    bias = {str(i): PAD_BIAS for i in padding_ids}
    bias.update({str(t): b for t, b in p.logit_bias})  # the request's own (OpenAI's logit_bias)
    if bias:
        body["logit_bias"] = bias
    return body


# vLLM's sampling extensions under vLLM's own names, each with the value that means "off".
_EXTENSION_DEFAULTS = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                       "frequency_penalty": 0.0, "min_tokens": 0, "ignore_eos": False}


def _extensions(p: SamplingParams) -> dict[str, object]:
    """The extensions a row sets; none when it sets none, so a plain row's body is unchanged."""
    return {name: getattr(p, name) for name, off in _EXTENSION_DEFAULTS.items() if getattr(p, name) != off}


def raise_for_status(response: httpx.Response) -> None:
    """4xx: the request was bad (``ValueError``); 5xx: vLLM is in trouble (``GeneratorUnavailable``)."""
    if response.status_code < 400:
        return
    try:
        detail = response.json()
        error = detail.get("error") if isinstance(detail, dict) else None
        message = error.get("message") if isinstance(error, dict) else detail
    except ValueError:
        message = response.text
    if response.status_code < 500:
        raise ValueError(f"vLLM rejected the request ({response.status_code}): {message}")
    raise GeneratorUnavailable(f"vLLM answered {response.status_code}: {message}", retry_after=5.0)


async def sse_payloads(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream, up to ``[DONE]``; an error event raises."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        payload = json.loads(data)
        if "error" in payload:
            raise GeneratorUnavailable(f"vLLM failed mid-stream: {payload['error']}", retry_after=5.0)
        yield payload


class ChoiceLogprobs(TypedDict, total=False):
    """A choice's ``logprobs`` as vLLM sends them (tokens named ``token_id:<id>``)."""

    token_logprobs: list[float]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(TypedDict, total=False):
    """One choice of vLLM's ``/v1/completions`` answer, or of one stream chunk (the fields read here)."""

    token_ids: list[int] | None
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length"}


@dataclass
class RowState:
    """One row's tokens as they arrive, before the stop-string cut."""

    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    emitted: int = 0
    finish: str | None = None

    def absorb(self, choice: CompletionChoice) -> None:
        """Append one answer (or one stream chunk) of ids and log-probs."""
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs") or []
        if len(values) != len(ids):
            raise RuntimeError(f"vLLM returned {len(ids)} token ids but {len(values)} log-probs")
        self.ids.extend(ids)
        self.logprobs.extend(float(v) for v in values)
        k = self.params.top_logprobs
        if k > 0:
            for alternatives in logprobs.get("top_logprobs") or []:
                ranked = sorted(((_token_id(t), float(v)) for t, v in (alternatives or {}).items()), key=lambda kv: -kv[1])
                self.top.append(ranked[:k])
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]

    def alternatives(self, k: int) -> list[tuple[int, float]] | None:
        """Token ``k``'s top alternatives when the row asked for them, else None."""
        return self.top[k] if self.params.top_logprobs > 0 else None

    def release(self, decode: Callable[[Sequence[int]], str]) -> range:
        """Indices of tokens that may be streamed now (never ones a stop string will cut)."""
        stops = self.params.stop
        keep = cut_at_stop(self.ids, stops, decode, self.params.min_tokens)  # the final cut is known
        upto = keep if keep is not None else releasable(self.ids, stops, self.emitted, decode)
        start, self.emitted = self.emitted, max(self.emitted, upto)
        return range(start, self.emitted)

    def generation(self, decode: Callable[[Sequence[int]], str]) -> Generation:
        """The final row: ids cut before a stop string, finish reason mapped to stop/length."""
        finish = _FINISH.get(self.finish)
        if finish is None:
            # "abort" (vLLM paused in abort mode, or shut down) or a stream that ended early
            raise GeneratorUnavailable(f"vLLM ended the request with finish_reason={self.finish!r}", retry_after=5.0)
        keep = cut_at_stop(self.ids, self.params.stop, decode, self.params.min_tokens)
        if keep is not None:
            del self.ids[keep:], self.logprobs[keep:], self.top[keep:]
            finish = "stop"
        self.emitted = min(self.emitted, len(self.ids))
        return Generation(
            token_ids=self.ids, logprobs=self.logprobs, finish_reason=finish,
            top_logprobs=self.top if self.params.top_logprobs > 0 else None,
        )


def _token_id(key: str) -> int:
    if not key.startswith(_TOKEN_PREFIX):
        raise RuntimeError(f"vLLM returned a top log-prob key {key!r}; expected {_TOKEN_PREFIX}<id>")
    return int(key[len(_TOKEN_PREFIX):])


async def request_row(client: httpx.AsyncClient, url: str, body: dict[str, object], p: SamplingParams,
                      decode: Callable[[Sequence[int]], str], index: int, sink: TokenSink | None) -> Generation:
    """One row through vLLM's ``/v1/completions``: whole, or streamed into ``sink`` token by token
    (tokens that a stop string may still cut are held back until the row ends)."""
    row = RowState(p)
    if sink is None:
        response = await client.post(url, json=body)
        raise_for_status(response)
        row.absorb(response.json()["choices"][0])
    else:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise_for_status(response)
            async for chunk in sse_payloads(response):
                for choice in chunk.get("choices", []):
                    row.absorb(choice)
                    for k in row.release(decode):
                        sink(index, row.ids[k], row.logprobs[k], row.alternatives(k))
    emitted = row.emitted
    generation = row.generation(decode)
    if sink is not None:
        for k in range(emitted, len(generation.token_ids)):
            sink(index, generation.token_ids[k], generation.logprobs[k], row.alternatives(k))
    return generation
