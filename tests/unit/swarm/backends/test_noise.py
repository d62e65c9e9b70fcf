"""Counter-based sampling noise (``swarm.backends.noise``) and the rows that use it: the noise is a pure
function of its key, and a keyed row samples bitwise the same tokens and log-probs alone, inside a batch
of other rows (keyed or not), and when it joins a running batch."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from swarm.backends import noise
from swarm.backends.base import Generation, RowFeed, SamplingParams
from swarm.backends.sampling_params import validate_requests
from swarm.backends.torch import TorchBackend

# Both decoding caches: a keyed row must leave the static slots a GPU uses by default for a batch of its own.
both_caches = pytest.mark.parametrize("backend", ["dynamic", "static"], indirect=True)


def test_noise_is_a_pure_function_of_its_key() -> None:
    key = noise.sample_key(7, "train", "task-3", 0, 1, 0, 0, None)
    assert key == noise.sample_key(7, "train", "task-3", 0, 1, 0, 0, None)  # no process salt, no state
    assert 0 <= key < 2**64
    others = {noise.sample_key(8, "train", "task-3", 0, 1, 0, 0, None),  # seed, task, round, member, call, choice
              noise.sample_key(7, "train", "task-4", 0, 1, 0, 0, None),
              noise.sample_key(7, "train", "task-3", 1, 1, 0, 0, None),
              noise.sample_key(7, "train", "task-3", 0, 2, 0, 0, None),
              noise.sample_key(7, "train", "task-3", 0, 1, 1, 0, None),
              noise.sample_key(7, "train", "task-3", 0, 1, 0, 1, None)}
    assert key not in others and len(others) == 6
    draws = [noise.uniform(key, position) for position in range(2000)]
    assert draws == [noise.uniform(key, position) for position in reversed(range(2000))][::-1]  # any order
    assert all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.03 and len(set(draws)) == len(draws)
    assert noise.uniform(0, 0) == (noise.splitmix64(0x9E3779B97F4A7C15) >> 11) * 2.0**-53  # splitmix64's first output
    with pytest.raises(ValueError, match="position"):
        noise.uniform(key, -1)
    with pytest.raises(ValueError, match="noise_key"):
        validate_requests([[1]], [SamplingParams(max_tokens=1, noise_key=2**64)], max_context=8, vocab_size=4)


def _prompt(backend: TorchBackend, text: str) -> list[int]:
    return backend.render_prompt([{"role": "user", "content": text}], None)


def _same(alone: Generation, other: Generation) -> None:
    assert other.token_ids == alone.token_ids
    assert other.logprobs == alone.logprobs  # bitwise: the row's forwards had exactly the same inputs
    assert other.finish_reason == alone.finish_reason


@both_caches
def test_a_keyed_row_samples_the_same_alone_and_in_a_batch(backend: TorchBackend) -> None:
    prompt = _prompt(backend, "Spell a word.")
    row = SamplingParams(max_tokens=24, temperature=1.0, noise_key=noise.sample_key(0, "row", 1))
    alone = backend.generate([prompt], [row])[0]
    neighbours = [(_prompt(backend, "a much longer prompt " * 6), SamplingParams(max_tokens=30)),
                  ([97, 98], SamplingParams(max_tokens=5, seed=3)),
                  (_prompt(backend, "Hi."), SamplingParams(max_tokens=18, top_p=0.8,
                                                           noise_key=noise.sample_key(0, "row", 2)))]
    for before in (neighbours, neighbours[::-1]):  # the row's place in the batch does not matter either
        prompts = [p for p, _ in before] + [prompt]
        params = [p for _, p in before] + [row]
        _same(alone, backend.generate(prompts, params)[-1])
    # Same key, same distribution: the noise, not the row's company, decides the tokens; another key differs.
    other = backend.generate([prompt], [SamplingParams(max_tokens=24, noise_key=noise.sample_key(0, "row", 3))])[0]
    assert other.token_ids != alone.token_ids


class _JoinLater(RowFeed):
    """Offers one keyed row at the third admit call of a running batch."""

    def __init__(self, prompt: list[int], params: SamplingParams) -> None:
        self.rows, self.calls = [(prompt, params)], 0
        self.done: dict[int, Generation] = {}

    def admit(self) -> Sequence[tuple[Sequence[int], SamplingParams]]:
        self.calls += 1
        return self.rows if self.calls == 3 else []

    def finished(self, row: int, generation: Generation) -> None:
        self.done[row] = generation

    def rejected(self, row: int, error: ValueError) -> None:
        raise AssertionError(error)


@both_caches
def test_a_keyed_row_joining_a_running_batch_samples_what_it_would_alone(backend: TorchBackend) -> None:
    prompt = _prompt(backend, "Count to five.")
    row = SamplingParams(max_tokens=16, noise_key=noise.sample_key(0, "joiner"))
    alone = backend.generate([prompt], [row])[0]
    feed = _JoinLater(prompt, row)
    backend.generate([_prompt(backend, "Hi."), [97, 98, 99]],
                     [SamplingParams(max_tokens=20, ignore_eos=True), SamplingParams(max_tokens=20, seed=1)],
                     feed=feed)
    assert feed.calls > 3  # it joined mid-batch (rows 0 and 1 are the initial ones)
    _same(alone, feed.done[2])


def test_coupled_rows_share_the_batch_and_still_sample_their_keys_noise(backend: TorchBackend) -> None:
    """``--coupled``: keyed rows that are not batch-invariant take one batched forward per decode step (not
    one each) and draw the same tokens from the same keys as alone, up to the batch's float rounding."""
    prompts = [_prompt(backend, text) for text in ("Spell a word.", "Hi.", "Count to five.")]

    def rows(batch_invariant: bool) -> list[SamplingParams]:
        return [SamplingParams(max_tokens=12, ignore_eos=True, noise_key=noise.sample_key(0, "pair", i),
                               batch_invariant=batch_invariant) for i in range(len(prompts))]

    forwards = []
    hook = backend.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        coupled = backend.generate(prompts, rows(False))
        shared = len(forwards)
        forwards.clear()
        exact = backend.generate(prompts, rows(True))
    finally:
        hook.remove()
    assert len(forwards) == len(prompts) * shared  # batch-invariant rows decode one by one
    assert [g.token_ids for g in coupled] == [g.token_ids for g in exact]  # the keys' noise, not the batch's
    for c, e in zip(coupled, exact, strict=True):
        assert c.logprobs == pytest.approx(e.logprobs, abs=1e-4)
    uncoupled = backend.generate(prompts, [SamplingParams(max_tokens=12, ignore_eos=True) for _ in prompts])
    assert [g.token_ids for g in uncoupled] != [g.token_ids for g in coupled]
