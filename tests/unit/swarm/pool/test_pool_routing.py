"""GeneratorPool routing on members whose generators are stand-ins (no model, no HTTP): sticky per
affinity, least loaded otherwise, never outside the staleness bound, and a member lost mid-call
continued on another from exactly the tokens it produced."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from swarm.backends.base import Generation, GeneratorUnavailable, Sampled, SamplingParams, TokenSink
from swarm.pool.members import Member
from swarm.pool.pool import GeneratorPool
from swarm.pool.remote import WorkerLost
from swarm.pool.stitch import Rows

EOS = 0


@dataclass
class Bound:
    mode: str = "async"
    max_staleness: int = 1


class Text:
    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(96 + i) for i in ids)


class CountingGenerator:
    """Counts from ``start`` (token i has log-prob -i/10), streaming each token; ``die_after``:
    raises ``WorkerLost`` after streaming that many tokens of a row (a worker killed mid-call)."""

    def __init__(self, version: int, start: int = 1, die_after: int | None = None, hold: asyncio.Event | None = None):
        self.version, self.start, self.die_after, self.hold = version, start, die_after, hold
        self.calls: list[tuple[list[list[int]], list[SamplingParams]]] = []

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        self.calls.append(([list(p) for p in prompts], list(params)))
        if self.hold is not None:
            await self.hold.wait()
        rows = []
        for row, p in enumerate(params):
            ids = [self.start + k for k in range(p.max_tokens)]
            for k, token in enumerate(ids):
                if self.die_after is not None and k == self.die_after:
                    raise WorkerLost("connection reset")
                if sink is not None:
                    sink(row, token, -token / 10, None)
            rows.append(Generation(token_ids=ids, logprobs=[-t / 10 for t in ids], finish_reason="length"))
        return Sampled(generations=rows, policy_version=self.version)


@dataclass
class _Live:
    """The live config cell the pool reads its staleness rule from."""

    config: Bound


def _pool(bound: Bound, published: int = 3) -> GeneratorPool:
    pool = GeneratorPool(None, text=Text(), model_name="m", max_context=512, eos_token_id=EOS,  # type: ignore[arg-type]
                         live=_Live(bound))
    pool._published = published
    return pool


def _member(pool: GeneratorPool, name: str, generator: CountingGenerator, capacity: int = 4) -> Member:
    member = Member(id=name, engine_name="torch", generator=generator, capacity=capacity, address=f"http://{name}",
                    version=generator.version)
    pool.add(member)
    return member


def _params(n: int = 4) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n)]


def test_calls_of_one_affinity_stay_on_one_member_and_others_go_to_the_least_loaded() -> None:
    pool = _pool(Bound())
    a, b = _member(pool, "a", CountingGenerator(3)), _member(pool, "b", CountingGenerator(3))
    first = pool.choose("episode-1")
    first.in_flight = 3  # now the busier one
    assert pool.choose("episode-1") is first  # sticky while it may serve
    other = pool.choose("episode-2")
    assert other is not first and {first.id, other.id} == {a.id, b.id}
    b.capacity = 100  # load is in-flight rows per unit of capacity
    a.in_flight, b.in_flight = 1, 10
    assert pool.choose(None) is b


def test_members_outside_the_staleness_bound_get_no_calls() -> None:
    bound = Bound(mode="async", max_staleness=1)
    pool = _pool(bound, published=5)
    old = _member(pool, "old", CountingGenerator(3))
    fresh = _member(pool, "fresh", CountingGenerator(4))
    assert pool.choose("e") is fresh  # 5 - 3 > 1
    assert old.state(5, bound) == "syncing" and fresh.state(5, bound) == "ready"
    bound.mode = "sync"  # only the newest version serves
    with pytest.raises(GeneratorUnavailable, match="no pool member may serve policy version 5"):
        pool.choose("e")
    fresh.version = 5
    assert pool.choose("e") is fresh
    fresh.phase = "draining"
    with pytest.raises(GeneratorUnavailable):
        pool.choose(None)
    assert not pool.available


def test_a_member_lost_mid_call_is_dropped_and_the_rows_continue_elsewhere_exactly() -> None:
    pool = _pool(Bound(max_staleness=4))
    dying = CountingGenerator(3, start=1, die_after=2)
    spare = CountingGenerator(3, start=50)
    _member(pool, "dying", dying, capacity=100)  # least loaded: chosen first
    _member(pool, "spare", spare, capacity=1)
    streamed: list[tuple[int, int]] = []
    prompt = [7, 8, 9]

    async def run() -> Sampled:
        return await pool.generate([prompt], _params(5), lambda r, t, lp, top: streamed.append((r, t)),
                                   affinity="ep")

    sampled = asyncio.run(run())
    generation = sampled.generations[0]
    # Two tokens from the dead member, then three more from the spare, continuing after them.
    assert generation.token_ids == [1, 2, 50, 51, 52]
    assert generation.logprobs == pytest.approx([-0.1, -0.2, -5.0, -5.1, -5.2])
    assert spare.calls[0][0] == [[*prompt, 1, 2]] and spare.calls[0][1][0].max_tokens == 3
    assert streamed == [(0, 1), (0, 2), (0, 50), (0, 51), (0, 52)]  # the caller's stream never repeats
    assert pool.members["dying"].phase == "dropped" and sampled.source == "spare"
    assert [w.state for w in pool.workers()] == ["dropped", "ready"]


def test_a_row_that_ended_before_its_member_died_is_not_run_again() -> None:
    ended = Rows([[5]], [SamplingParams(max_tokens=8)], eos=EOS, decode=Text().decode)
    ended.rows[0].ids, ended.rows[0].logprobs = [3, EOS], [-0.1, -0.2]  # its end-of-turn token came
    assert ended.pending() == [] and ended.generations()[0].finish_reason == "stop"
    stops = Rows([[5]], [SamplingParams(max_tokens=8, stop=("cd",))], eos=EOS, decode=Text().decode)
    stops.rows[0].ids, stops.rows[0].logprobs = [1, 3, 4], [-0.1, -0.3, -0.4]  # "acd": a stop string came
    assert stops.pending() == [] and stops.generations()[0].token_ids == [1]  # cut before the "c"
    running = Rows([[5]], [SamplingParams(max_tokens=8)], eos=EOS, decode=Text().decode)
    running.rows[0].ids, running.rows[0].logprobs = [3, 4], [-0.3, -0.4]
    assert running.pending() == [0] and running.rows[0].rest() == ([5, 3, 4], SamplingParams(max_tokens=6))


def test_no_member_left_is_a_503_not_a_hang() -> None:
    pool = _pool(Bound())
    _member(pool, "only", CountingGenerator(3, die_after=0))
    with pytest.raises(GeneratorUnavailable):
        asyncio.run(pool.generate([[1]], _params(), affinity="e"))
