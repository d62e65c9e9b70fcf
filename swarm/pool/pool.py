"""``GeneratorPool``: the server's generator as a pool of members (docs/guides/pool.md; its place on the
chat path: docs/architecture.md).

The server core and chat completions talk to this one ``Generator``; behind it are the server's own
generator (the ``local`` member, unless ``--no-local-generator``) and any ``swarm worker`` processes
that joined (``swarm.pool.roster``). Routing, per call:

- only members that may serve: active (not draining or dropped) and within the staleness bound
  (``mode="sync"``: they hold the newest published version; ``async``: at most ``max_staleness``
  behind it); the local member is always within it (its publication is the server's business);
- sticky per ``affinity`` (an episode's id): its calls stay on one member while it may serve, so the
  episode's prefix stays warm; otherwise the least loaded (rows in flight / capacity);
- none can serve: ``GeneratorUnavailable`` (a 503 with Retry-After; no episode is lost).

A remote call that fails (the worker died, its connection broke) drops that worker and re-runs the
rows on another member from exactly the tokens already produced (``swarm.pool.stitch``).
Publication (``load_weights``) loads the local member as before and sends the version to the remote
members (``swarm.pool.roster``: in async mode that push overlaps the next step); ``last_publication``
holds the figures of the last push that finished, for the step's metrics. When the trainer streams
its weights into the local member (``load_streamed``, NCCL), the remote members get a copy exported
from the trainer; after a failed local publication (``recover``) they get the version before the
local member restarts.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal, Protocol

from swarm.backends.base import Generator, GeneratorUnavailable, Sampled, SamplingParams, TokenSink, Weights
from swarm.mismatch import SOURCE_DIFF_PREFIX
from swarm.pool.members import Bound, LiveBound, LocalMember, Member
from swarm.pool.remote import WorkerBusy, WorkerLost
from swarm.pool.stitch import Rows
from swarm.protocol import WorkerStatus
from swarm.text.templates import ChatText

log = logging.getLogger(__name__)

_STICKY_MAX = 65_536  # affinities remembered (oldest forgotten first)
_RETRY_AFTER_S = 1.0


class Dissemination(Protocol):
    """The pool's remote membership as its holders see it (``swarm.pool.roster.Roster``, which
    registers itself as ``pool.roster``): push each published version to the remote members, sweep
    members whose lease lapsed (the server runs it for the pool's life), and stop."""

    async def disseminate(self, version: int, weights: Weights | None, *, overlap: bool = False) -> None: ...

    async def run_sweeper(self) -> None: ...

    async def close(self) -> None: ...


class GeneratorPool(Generator):
    """A ``Generator`` over members. ``live.config`` holds the live staleness rule (the server's config)."""

    def __init__(self, local: Generator | None, *, text: ChatText, model_name: str, max_context: int,
                 eos_token_id: int, live: LiveBound, local_engine: str = "torch",
                 local_capacity: int = 64, include_local: bool = True) -> None:
        self.local = local
        self.text = text
        self.model_name = model_name
        self.max_context = max_context
        self.eos_token_id = eos_token_id
        self.live = live
        self.reports_top_logprobs = local.reports_top_logprobs if local is not None else True
        self.members: dict[str, Member] = {}
        if local is not None and include_local:
            self.members["local"] = LocalMember(local, local_engine, local_capacity)
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._published = local.policy_version if local is not None else 0
        self.last_publication: dict[str, float] = {}  # the last publication's figures (the step's metrics)
        self.roster: Dissemination | None = None  # remote membership and dissemination (set by the Roster)
        self._mode: Literal["sync", "async"] = "async"

    # ------------------------------------------------------------------ the Generator hooks

    @property
    def mode(self) -> Literal["sync", "async"]:
        return self._mode

    @mode.setter
    def mode(self, value: Literal["sync", "async"]) -> None:
        self._mode = value
        if self.local is not None:
            self.local.mode = value

    @property
    def streams_weights(self) -> bool:
        return self.local is not None and self.local.streams_weights

    @property
    def start_timeout(self) -> float:  # type: ignore[override]  # read only: the local member's, which sets its own
        return self.local.start_timeout if self.local is not None else 0.0

    @property
    def restarts_on_recover(self) -> bool:  # type: ignore[override]  # read only: the local member's
        return self.local is not None and self.local.restarts_on_recover

    @property
    def on_status(self) -> Callable[[Any], None] | None:
        return self.local.on_status if self.local is not None else None

    @on_status.setter
    def on_status(self, value: Callable[[Any], None] | None) -> None:
        if self.local is not None:
            self.local.on_status = value

    @property
    def policy_version(self) -> int:
        """The newest version published to the pool (the local member's, when there is one)."""
        if self.local is not None:
            return self.local.policy_version
        return self._published

    @property
    def published_version(self) -> int:
        """The newest version handed to the pool (what sync mode requires of a member)."""
        return self._published

    @property
    def available(self) -> bool:
        return any(m.eligible(self._published, self.live.config) for m in self.members.values())

    def describe(self) -> dict[str, object]:
        """The local generator's description (the engine and its health), plus the pool's size."""
        base = self.local.describe() if self.local is not None else {"engine": "pool", "alive": True,
                                                                      "policy_version": self._published}
        ready = sum(1 for w in self.workers() if w.state == "ready")
        return {**base, "pool_members": len(self.members), "pool_ready": ready}

    def workers(self) -> list[WorkerStatus]:
        """Every member for ``/api/v1/status`` (the local one first)."""
        bound, newest = self.live.config, self._published
        return [m.status(newest, bound) for m in self.members.values()]

    async def start(self) -> None:
        if self.local is not None:
            await self.local.start()

    async def close(self) -> None:
        if self.roster is not None:
            await self.roster.close()
        for member in list(self.members.values()):
            close = getattr(member.generator, "aclose", None)
            if member.remote and close is not None:
                await close()
        if self.local is not None:
            await self.local.close()

    # ------------------------------------------------------------------ weights

    async def load_weights(self, version: int, weights: Weights) -> None:
        """The local member loads them as before; then the remote members get them (``Roster``)."""
        if self.local is not None:
            await self.local.load_weights(version, weights)
        self._published = max(self._published, version)
        if self.roster is not None:  # async: the push to the workers overlaps the next step
            await self.roster.disseminate(version, weights, overlap=self._mode == "async")

    async def load_streamed(self, version: int) -> None:
        if self.local is None:
            raise NotImplementedError("a pool without a local generator does not receive streamed weights")
        await self.local.load_streamed(version)
        self._published = max(self._published, version)
        if self.roster is not None:  # a worker cannot join a stream: it gets the trainer's exported copy
            await self.roster.disseminate(version, None, overlap=self._mode == "async")

    async def recover(self, version: int, weights: Weights) -> None:
        """After a failed publication to the local member: the remote members get ``version`` first
        (they serve while the local one restarts, which may take long or fail), then the local one."""
        self._published = max(self._published, version)
        if self.roster is not None:
            await self.roster.disseminate(version, weights, overlap=self._mode == "async")
        if self.local is not None:
            await self.local.recover(version, weights)

    # ------------------------------------------------------------------ generation

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        """Route the call (see the module docstring). The local member runs it as it came: it is never
        continued elsewhere, so there is nothing to stitch. A remote member's rows are kept as they
        stream (``swarm.pool.stitch``) so that a lost member's rows continue on another from the tokens
        it produced; every member tried and none left: 503."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        if not prompts:
            return Sampled(generations=[], policy_version=self.policy_version)
        member = self.choose(affinity, rows=len(prompts))
        if member.remote:
            return await self._stitched(member, prompts, params, sink, affinity)
        sampled = await self._run(member, prompts, params, sink, affinity)
        return Sampled(generations=sampled.generations, policy_version=sampled.policy_version, source=member.id)

    async def _run(self, member: Member, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                   sink: TokenSink | None, affinity: str | None) -> Sampled:
        """One call on one member: counted in its load while it runs, and in its output once it returns."""
        member.in_flight += len(prompts)
        try:
            sampled = await member.generator.generate(prompts, params, sink, affinity=affinity)
        finally:
            member.in_flight -= len(prompts)
        member.produced(sum(len(g.token_ids) for g in sampled.generations))
        return sampled

    async def _stitched(self, first: Member, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                        sink: TokenSink | None, affinity: str | None) -> Sampled:
        """A call that starts on the remote member ``first``, its rows continued on others if it fails."""
        rows = Rows(prompts, params, eos=self.eos_token_id, decode=self.text.decode)
        tried: set[str] = set()
        versions: list[int] = []
        source: str | None = None
        chosen: Member | None = first
        while pending := rows.pending():
            member = chosen if chosen is not None else self.choose(affinity, exclude=tried, rows=len(pending))
            chosen = None
            rows.mark()
            cont = [rows.rows[i].rest() for i in pending]
            try:
                sampled = await self._run(member, [c[0] for c in cont], [c[1] for c in cont],
                                          rows.sink(pending, sink) if member.remote else _forward(pending, sink),
                                          affinity)
            except (WorkerLost, WorkerBusy) as exc:
                tried.add(member.id)
                if isinstance(exc, WorkerLost):
                    self.drop(member.id, str(exc))
                log.warning("pool member %s failed a call (%s); %d row(s) continue on another", member.id, exc,
                            len(pending))
                continue
            rows.finish(pending, sampled.generations, streamed=member.remote)
            versions.append(sampled.policy_version)
            source = member.id
        version = min(versions) if versions else self.policy_version
        return Sampled(generations=rows.generations(), policy_version=version, source=source)

    def choose(self, affinity: str | None, *, exclude: Collection[str] = (), rows: int = 1) -> Member:
        """The member a call goes to: the affinity's member while it may serve, else the least loaded."""
        bound, newest = self.live.config, self._published
        candidates = [m for m in self.members.values() if m.id not in exclude and m.eligible(newest, bound)]
        if not candidates:
            raise GeneratorUnavailable(self._why_none(newest, bound), retry_after=_RETRY_AFTER_S)
        if affinity is not None:
            sticky = self._sticky.get(affinity)
            chosen = next((m for m in candidates if m.id == sticky), None)
            if chosen is not None:
                self._sticky.move_to_end(affinity)
                return chosen
        chosen = min(candidates, key=lambda m: (m.load(), m.in_flight, m.id != "local"))
        if affinity is not None:
            self._sticky[affinity] = chosen.id
            self._sticky.move_to_end(affinity)
            while len(self._sticky) > _STICKY_MAX:
                self._sticky.popitem(last=False)
        return chosen

    def _why_none(self, newest: int, bound: Bound) -> str:
        if not self.members:
            return "the generator pool has no members (no local generator and no worker has joined)"
        states = ", ".join(f"{m.id}: {m.state(newest, bound)} at version {m.held_version()}"
                           for m in self.members.values())
        return f"no pool member may serve policy version {newest} ({bound.mode} mode) now ({states})"

    def after_step(self, metrics: dict[str, float], bound: float | None) -> None:
        """Add the last publication's figures to a step's ``metrics`` and apply its mismatch rule."""
        metrics.update(self.last_publication)
        self.mismatch(metrics, bound)

    def mismatch(self, metrics: dict[str, float], bound: float | None) -> None:
        """Take a step's per-member log-prob mismatch (``SOURCE_DIFF_PREFIX`` keys, the trainer's
        recomputation of what each member sampled) and drain a remote member beyond ``bound``: one
        that serves another model or a stale version is caught by arithmetic, not trust."""
        for key, value in metrics.items():
            if not key.startswith(SOURCE_DIFF_PREFIX):
                continue
            member = self.members.get(key[len(SOURCE_DIFF_PREFIX):])
            if member is None:
                continue
            member.logprob_diff_max = value
            if bound is not None and value > bound and member.remote and member.phase == "active":
                member.phase = "draining"
                log.warning("pool member %s drained: its log-probs differ from the trainer's by %.3g "
                            "(max_worker_logprob_diff=%g)", member.id, value, bound)

    # ------------------------------------------------------------------ membership

    def add(self, member: Member) -> None:
        self.members[member.id] = member

    def drop(self, member_id: str, reason: str) -> None:
        """Stop routing to a member (it stays listed as ``dropped``)."""
        member = self.members.get(member_id)
        if member is None or member.phase == "dropped" or not member.remote:
            return
        member.phase = "dropped"
        log.warning("pool member %s dropped: %s", member_id, reason)

    def remote_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.remote and m.phase != "dropped"]


def _forward(indices: list[int], sink: TokenSink | None) -> TokenSink | None:
    """A local member's sink: its row i is the caller's row ``indices[i]`` (no copy kept: a local
    call is never continued elsewhere)."""
    if sink is None:
        return None
    if indices == list(range(len(indices))):
        return sink
    return lambda row, token, logprob, top: sink(indices[row], token, logprob, top)
