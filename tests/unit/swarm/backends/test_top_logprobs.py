"""``top_logprobs`` in the torch sampler: per-row widths in one batch, rows that join, stop-string cuts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from swarm.backends.base import Generation, RowFeed, SamplingParams
from swarm.backends.torch import TorchBackend

# Every test on both decoding caches: the growing one and the static slots a GPU uses by default.
pytestmark = pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)

USER = [{"role": "user", "content": "Spell a word."}]


class _JoinOnce(RowFeed):
    """A ``RowFeed`` that offers its rows at the third admit call and keeps what finishes."""

    def __init__(self, rows: list[tuple[list[int], SamplingParams]]) -> None:
        self.rows, self.calls, self.done = rows, 0, {}

    def admit(self) -> Sequence[tuple[Sequence[int], SamplingParams]]:
        self.calls += 1
        return self.rows if self.calls == 3 else []

    def finished(self, row: int, generation: Generation) -> None:
        self.done[row] = generation

    def rejected(self, row: int, error: ValueError) -> None:
        raise AssertionError(f"row {row} rejected: {error}")


def _check(gen: Generation, alone: Generation, k: int) -> None:
    """Asking for alternatives does not change sampling; ``k`` of them per token, most likely first,
    the chosen token's own entry equal to its recorded log-prob."""
    assert gen.token_ids == alone.token_ids
    if k == 0:
        assert gen.top_logprobs is None
        return
    assert gen.top_logprobs is not None and len(gen.top_logprobs) == len(gen.token_ids)
    for token, logprob, alternatives in zip(gen.token_ids, gen.logprobs, gen.top_logprobs):
        assert len(alternatives) == k
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True) and values[0] >= logprob
        if token == alternatives[0][0]:
            assert values[0] == logprob
        assert dict(alternatives).get(token, logprob) == pytest.approx(logprob, abs=1e-6)
    # The same alternatives as the row alone gets (batch neighbours change floats by rounding only).
    assert alone.top_logprobs is not None
    for mine, theirs in zip(gen.top_logprobs, alone.top_logprobs, strict=True):
        assert [lp for _, lp in mine] == pytest.approx([lp for _, lp in theirs], abs=1e-4)


def test_rows_report_their_own_number_of_alternatives(backend: TorchBackend) -> None:
    prompt = backend.render_prompt(USER, None)
    free = backend.generate([prompt], [SamplingParams(max_tokens=30, temperature=0.0)])[0]
    text = backend.decode(free.token_ids)
    stop = next(text[i : i + 2] for i in range(3, len(text) - 1) if "\ufffd" not in text[i : i + 2])
    first = [SamplingParams(max_tokens=20, temperature=0.9, seed=1, top_logprobs=3),
             SamplingParams(max_tokens=12, temperature=0.9, seed=2),
             SamplingParams(max_tokens=30, temperature=0.0, stop=(stop,), top_logprobs=20)]
    joining = [([97, 98, 99], SamplingParams(max_tokens=10, temperature=1.2, seed=4, top_logprobs=1)),
               ([100, 101], SamplingParams(max_tokens=8, temperature=1.0, seed=5))]
    feed = _JoinOnce(joining)
    returned = backend.generate([prompt] * 3, first, feed=feed)

    assert returned[2].finish_reason == "stop" and stop not in backend.decode(returned[2].token_ids)
    for gen, params in zip(returned, first):
        _check(gen, backend.generate([prompt], [params])[0], params.top_logprobs)
    for index, (row_prompt, params) in enumerate(joining, start=3):
        _check(feed.done[index], backend.generate([row_prompt], [params])[0], params.top_logprobs)
