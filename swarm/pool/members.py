"""The pool's members as the router sees them: who they are, what they hold, how busy they are.

A ``Member`` wraps anything that can run ``generate`` (the server's own ``Generator``, or a
``RemoteWorker`` client of a ``swarm worker`` process) with the facts routing needs: the version it
serves, its phase (active, draining, dropped), rows in flight against its capacity, a lease, and
measured throughput. Its displayed ``state`` (``syncing`` / ``ready`` / ``draining`` / ``dropped``)
is derived from the phase and whether its version is within the staleness bound, so there is one
rule for "may serve" and status never disagrees with routing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from swarm.backends.base import Generator, Sampled, SamplingParams, TokenSink
from swarm.protocol import WorkerState, WorkerStatus

Phase = Literal["active", "draining", "dropped"]
LOCAL_ID = "local"
_RATE_WINDOW_S = 10.0


class MemberGenerator(Protocol):
    """What a member generates with: a ``Generator`` or a ``RemoteWorker``."""

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled: ...


class Bound(Protocol):
    """The staleness rule the pool routes by (``ServerConfig`` has these fields)."""

    mode: Literal["sync", "async"]
    max_staleness: int


class LiveBound(Protocol):
    """Where the pool reads the live staleness rule (the server's ``swarm.server.view.LiveConfig``)."""

    @property
    def config(self) -> Bound: ...


@dataclass
class Member:
    """One pool member. ``version`` is what it holds (None: nothing loaded yet)."""

    id: str
    engine_name: str
    generator: MemberGenerator
    capacity: int
    address: str | None = None
    version: int | None = None
    phase: Phase = "active"
    in_flight: int = 0
    lease_expires: float = float("inf")
    logprob_diff_max: float | None = None
    joined_at: float = field(default_factory=time.monotonic)
    _tokens: deque[tuple[float, int]] = field(default_factory=deque)

    @property
    def remote(self) -> bool:
        return self.id != LOCAL_ID

    def held_version(self) -> int | None:
        return self.version

    def within(self, newest: int, bound: Bound) -> bool:
        """May serve under the staleness rule: sync, only the newest version; async, at most
        ``max_staleness`` versions behind it."""
        version = self.held_version()
        if version is None:
            return False
        if bound.mode == "sync":
            return version >= newest
        return newest - version <= bound.max_staleness

    def eligible(self, newest: int, bound: Bound) -> bool:
        return self.phase == "active" and self.within(newest, bound)

    def state(self, newest: int, bound: Bound) -> WorkerState:
        if self.phase != "active":
            return self.phase
        return "ready" if self.within(newest, bound) else "syncing"

    def load(self) -> float:
        """Rows in flight per unit of capacity (least-loaded routing)."""
        return self.in_flight / max(self.capacity, 1)

    def produced(self, tokens: int) -> None:
        now = time.monotonic()
        self._tokens.append((now, tokens))
        while self._tokens and self._tokens[0][0] < now - _RATE_WINDOW_S:
            self._tokens.popleft()

    def tokens_per_s(self) -> float:
        """Tokens it produced over the last few seconds (measured by the pool, the same for every member)."""
        if not self._tokens:
            return 0.0
        now = time.monotonic()
        span = min(_RATE_WINDOW_S, max(now - self.joined_at, 1e-3))
        return sum(n for t, n in self._tokens if t >= now - span) / span

    def status(self, newest: int, bound: Bound) -> WorkerStatus:
        return WorkerStatus(id=self.id, engine=self.engine_name, version=self.held_version(),
                            state=self.state(newest, bound), tokens_per_s=round(self.tokens_per_s(), 3),
                            address=self.address, in_flight=self.in_flight, capacity=self.capacity,
                            logprob_diff_max=self.logprob_diff_max)


class LocalMember(Member):
    """The server's own generator: its version is the generator's, and it is always eligible (its
    publication is the server's business: a failed one is reported and the generator restarted)."""

    def __init__(self, generator: Generator, engine_name: str, capacity: int) -> None:
        super().__init__(id=LOCAL_ID, engine_name=engine_name, generator=generator, capacity=capacity)
        self.local = generator  # the same generator, with the whole ``Generator`` contract

    def held_version(self) -> int | None:
        return self.local.policy_version

    def within(self, newest: int, bound: Bound) -> bool:
        return self.local.available
