"""Continuing a generation on another member after the one running it died.

A request is token ids, so a retry is exact: each row continues from its prompt plus the tokens
the dead member already produced (streamed to the pool as they were sampled), with the rest of its
``max_tokens``; the rows are then stitched together (ids, log-probs, alternatives), and the episode
sees one generation and some latency. A row whose partial output already ended (its end-of-turn or
a stop token, a stop string, or ``max_tokens``) is finished without another call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from swarm.backends.base import Generation, SamplingParams, TokenSink, TopAlternatives


@dataclass
class Row:
    """One row's prompt, params and the tokens already produced for it (on any member)."""

    prompt: list[int]
    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[TopAlternatives] = field(default_factory=list)
    done: Generation | None = None
    base: int = 0  # tokens produced before the current try (``Rows.mark``)
    base_tops: int = 0

    def add(self, token: int, logprob: float, top: TopAlternatives | None) -> None:
        self.ids.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            self.tops.append(top)

    def rest(self) -> tuple[list[int], SamplingParams]:
        """The continuation request: prompt + produced ids, the remaining token budget."""
        left = self.params.max_tokens - len(self.ids)
        params = replace(self.params, max_tokens=max(left, 1),
                         min_tokens=max(self.params.min_tokens - len(self.ids), 0))
        return self.prompt + self.ids, params

    def stitched(self, tail: Generation) -> Generation:
        """The produced ids followed by ``tail`` (what the continuation returned)."""
        tops = None
        if self.params.top_logprobs:
            tops = [*self.tops, *(tail.top_logprobs or [])]
        return Generation(token_ids=self.ids + list(tail.token_ids), logprobs=self.logprobs + list(tail.logprobs),
                          finish_reason=tail.finish_reason, top_logprobs=tops)


class Rows:
    """The rows of one pooled call, filled by the members that run them (first try and retries)."""

    def __init__(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *, eos: int,
                 decode: Callable[[list[int]], str]) -> None:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        self.rows = [Row(list(p), q) for p, q in zip(prompts, params, strict=True)]
        self._eos = eos
        self._decode = decode

    def pending(self) -> list[int]:
        """Rows still to run; rows whose partial output already ended are finished here."""
        out = []
        for index, row in enumerate(self.rows):
            if row.done is None:
                row.done = self._ended(row)
            if row.done is None:
                out.append(index)
        return out

    def sink(self, indices: list[int], outer: TokenSink | None) -> TokenSink:
        """A sink for a member running ``indices`` (its row i is our row ``indices[i]``) that keeps
        every token and passes it on to the caller's sink under the caller's row number."""

        def on_token(row: int, token: int, logprob: float, top: TopAlternatives | None) -> None:
            mine = indices[row]
            self.rows[mine].add(token, logprob, top)
            if outer is not None:
                outer(mine, token, logprob, top)

        return on_token

    def finish(self, indices: list[int], generations: Sequence[Generation], streamed: bool) -> None:
        """Rows ``indices`` came back. A streamed member's tokens are in the rows already: the result
        replaces them (it is the authority: ids cut at a stop string); otherwise it is appended."""
        for index, generation in zip(indices, generations, strict=True):
            row = self.rows[index]
            if streamed:
                del row.ids[row.base:], row.logprobs[row.base:], row.tops[row.base_tops:]
            row.done = row.stitched(generation)

    def mark(self) -> None:
        """Remember how far each row got before a (re)try, so ``finish`` can replace what it streams."""
        for row in self.rows:
            row.base, row.base_tops = len(row.ids), len(row.tops)

    def generations(self) -> list[Generation]:
        return [row.done for row in self.rows if row.done is not None]

    def _ended(self, row: Row) -> Generation | None:
        """A finished generation when ``row``'s partial output is already complete, else None."""
        if not row.ids:
            return None
        p = row.params
        last = row.ids[-1]
        if (last == self._eos and not p.ignore_eos) or last in p.stop_token_ids:
            return _whole(row, "stop")
        if p.stop:
            keep = self._before_stop(row.ids, p.stop)
            if keep is not None:
                return _whole(row, "stop", keep=keep)
        if len(row.ids) >= p.max_tokens:
            return _whole(row, "length")
        return None

    def _before_stop(self, ids: list[int], stops: Sequence[str]) -> int | None:
        """How many of ``ids`` come before the token where a stop string begins (None: no stop string)."""
        start = _stop_start(self._decode(ids), stops)
        if start is None:
            return None
        return max(j for j in range(len(ids) + 1) if len(self._decode(ids[:j])) <= start)


def _stop_start(text: str, stops: Sequence[str]) -> int | None:
    found = [text.find(s) for s in stops if s in text]
    return min(found) if found else None


def _whole(row: Row, reason: str, keep: int | None = None) -> Generation:
    n = len(row.ids) if keep is None else keep
    tops = row.tops[:n] if row.params.top_logprobs else None
    return Generation(token_ids=row.ids[:n], logprobs=row.logprobs[:n],
                      finish_reason="stop" if reason == "stop" else "length", top_logprobs=tops)
