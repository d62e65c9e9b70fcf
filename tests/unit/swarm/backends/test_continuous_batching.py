"""Continuous batching: rows that join a running ``generate`` sample exactly what they would alone."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from swarm.backends.base import Generation, RowFeed, SamplingParams
from swarm.backends.torch import TorchBackend

# Every test on both decoding caches: the growing one and the static slots a GPU uses by default.
pytestmark = pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)


class ScriptedFeed(RowFeed):
    """A ``RowFeed`` that offers given rows at given admit calls and records what comes back."""

    def __init__(self, schedule: dict[int, list[tuple[list[int], SamplingParams]]]) -> None:
        self.schedule = schedule
        self.calls = 0
        self.events: list[tuple[str, int]] = []  # ("admit", call) / ("finished", row) in order
        self.finished_rows: dict[int, Generation] = {}
        self.rejected_rows: dict[int, str] = {}

    def admit(self) -> Sequence[tuple[Sequence[int], SamplingParams]]:
        rows = self.schedule.get(self.calls, [])
        self.events.append(("admit", self.calls))
        self.calls += 1
        return rows

    def finished(self, row: int, generation: Generation) -> None:
        self.events.append(("finished", row))
        self.finished_rows[row] = generation

    def rejected(self, row: int, error: ValueError) -> None:
        self.rejected_rows[row] = str(error)


def _assert_same(alone: Generation, joined: Generation) -> None:
    assert joined.token_ids == alone.token_ids
    assert max((abs(a - b) for a, b in zip(alone.logprobs, joined.logprobs)), default=0.0) < 1e-4
    assert joined.finish_reason == alone.finish_reason


def test_rows_joining_mid_batch_match_generating_alone(backend: TorchBackend) -> None:
    short = backend.render_prompt([{"role": "user", "content": "Hi."}], None)
    long = backend.render_prompt([{"role": "system", "content": "a long system prompt " * 5},
                                  {"role": "user", "content": "Spell a word."}], None)
    first = [(short, SamplingParams(max_tokens=24, seed=1)), ([97, 98, 99], SamplingParams(max_tokens=6, seed=2))]
    # Joiners wider and narrower than the running cache, one with top-p and one greedy, and a
    # batch of two joining at once; row 3 finishes while rows 0 and 4 still run.
    schedule = {
        2: [(long, SamplingParams(max_tokens=20, seed=3, top_p=0.9))],
        4: [([100, 101], SamplingParams(max_tokens=5, seed=4))],
        9: [(short, SamplingParams(max_tokens=14, temperature=0.0)),
            (long, SamplingParams(max_tokens=16, temperature=0.7, seed=6))],
    }
    feed = ScriptedFeed(schedule)
    streamed: dict[int, list[int]] = {}
    returned = backend.generate([p for p, _ in first], [q for _, q in first],
                                on_token=lambda r, t, lp, top: streamed.setdefault(r, []).append(t), feed=feed)

    requests = first + [row for call in sorted(schedule) for row in schedule[call]]
    assert sorted(feed.finished_rows) == list(range(len(requests)))
    for index, (prompt, params) in enumerate(requests):
        alone = backend.generate([prompt], [params])[0]
        _assert_same(alone, feed.finished_rows[index])
        assert streamed[index] == alone.token_ids  # every token streamed once, in order
    assert returned == [feed.finished_rows[0], feed.finished_rows[1]]
    # Rows are reported the moment they finish: the short joiner (row 3) before row 0's end, and
    # row 1 (6 tokens) before the rows admitted at call 9 even joined.
    order = [row for kind, row in feed.events if kind == "finished"]
    assert order.index(3) < order.index(0)
    assert feed.events.index(("finished", 1)) < feed.events.index(("admit", 9))


def test_stop_strings_hold_for_joined_rows(backend: TorchBackend) -> None:
    prompt = backend.render_prompt([{"role": "user", "content": "Spell a word."}], None)
    free = backend.generate([prompt], [SamplingParams(max_tokens=40, seed=9)])[0]
    text = backend.decode(free.token_ids)
    stop = text[len(text) // 2: len(text) // 2 + 2]
    params = SamplingParams(max_tokens=40, seed=9, stop=(stop,))
    alone = backend.generate([prompt], [params])[0]
    assert alone.finish_reason == "stop" and stop not in backend.decode(alone.token_ids)

    feed = ScriptedFeed({3: [(prompt, params)]})
    streamed: list[int] = []
    backend.generate([prompt], [SamplingParams(max_tokens=30, seed=1)], feed=feed,
                     on_token=lambda r, t, lp, top: streamed.append(t) if r == 1 else None)
    _assert_same(alone, feed.finished_rows[1])
    assert streamed == alone.token_ids  # nothing past the stop string was ever streamed


def test_a_feed_alone_drives_generation_and_bad_rows_are_rejected(backend: TorchBackend) -> None:
    prompt = backend.render_prompt([{"role": "user", "content": "Hi."}], None)
    good = SamplingParams(max_tokens=8, seed=5)
    feed = ScriptedFeed({
        0: [(prompt, good), ([], good)],
        2: [(prompt, SamplingParams(max_tokens=backend.max_context)), ([1, 2, 3], SamplingParams(max_tokens=4, seed=6))],
    })
    assert backend.generate([], [], feed=feed) == []
    assert set(feed.rejected_rows) == {1, 2}
    assert "empty" in feed.rejected_rows[1] and "context" in feed.rejected_rows[2]
    assert set(feed.finished_rows) == {0, 3}
    _assert_same(backend.generate([prompt], [good])[0], feed.finished_rows[0])
    _assert_same(backend.generate([[1, 2, 3]], [SamplingParams(max_tokens=4, seed=6)])[0], feed.finished_rows[3])


def test_without_a_feed_nothing_changes(backend: TorchBackend) -> None:
    assert backend.generate([], []) == []
    with pytest.raises(ValueError, match="empty"):
        backend.generate([[]], [SamplingParams(max_tokens=4)], feed=ScriptedFeed({}))
