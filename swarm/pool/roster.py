"""``Roster``: pool membership on the server — join, heartbeat, leave, lease sweep — and the
dissemination of each new version to the members.

A worker joins (``Join``), is answered with the newest version (a full snapshot of it is ready in
the snapshot depot), loads it and heartbeats the version it holds; from then on it gets traffic
whenever that version is within the staleness bound. Every heartbeat renews its lease; a worker
whose lease runs out is dropped (the sweeper), one that leaves is drained (no new calls, running
ones finish). After each training step ``disseminate`` sends the new version along a relay chain
of the members that can apply it (a delta needs its base; a full snapshot goes to every active
member); the chain answers once each member it reached has loaded the version (bounded by
``disseminate_timeout_s``), so in sync mode they serve again at once; a worker it missed serves again
once it catches up (heartbeat, snapshot). In async mode the step waits only for the encoding: the
push overlaps the next step's training (members serve the previous version meanwhile, within the
staleness bound), and the next publication waits for it, so a step's pool figures are those of the
previous version's push (``pool/disseminated_version`` says which).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Protocol

from swarm.backends.base import Weights
from swarm.pool.members import Bound, Member
from swarm.pool.pool import GeneratorPool
from swarm.pool.remote import RemoteWorker
from swarm.pool.wire import Beat, BeatReply, Join, Joined
from swarm.weights.publish import SNAPSHOT_PREFIX, Encoded, Publisher

log = logging.getLogger(__name__)

_FORGET_DROPPED_S = 600.0  # a dropped member stays listed in status this long
_FAILED = "pool/disseminate_failed"  # in a step's metrics when its version did not go out
_PEERS = 4  # at most this many peers named to a worker catching up (it spreads its chunk requests over them)


class PoolConfig(Bound, Protocol):
    """The live config keys the roster reads (``ServerConfig`` has them)."""

    full_sync_every: int
    worker_lease_s: float
    disseminate_timeout_s: float


class LivePoolConfig(Protocol):
    """Where the roster reads the live config (the server's ``swarm.server.view.LiveConfig``)."""

    @property
    def config(self) -> PoolConfig: ...


class UnknownWorker(LookupError):
    """No such member, or it was dropped: the worker must join again."""


class Roster:
    """Members' comings and goings, and what each publication sends them."""

    def __init__(self, pool: GeneratorPool, publisher: Publisher, live: LivePoolConfig) -> None:
        self.pool = pool
        self.publisher = publisher
        self.live = live
        self._dropped_at: dict[str, float] = {}
        self._pushing: asyncio.Future[None] | None = None  # an overlapped push still running
        pool.roster = self

    async def join(self, body: Join) -> Joined:
        """Admit a worker as ``syncing``; it gets traffic once it holds a version it may serve."""
        version = await self.publisher.snapshot()
        config = self.live.config
        member_id = f"w-{secrets.token_hex(4)}"
        client = RemoteWorker(body.address, self.publisher.token, member_id=member_id)
        member = Member(id=member_id, engine_name=body.engine, generator=client, capacity=body.capacity,
                        address=client.address, lease_expires=time.monotonic() + config.worker_lease_s)
        self.pool.add(member)
        log.info("worker %s joined from %s (%s, capacity %d); it syncs to version %s", member_id, body.address,
                 body.engine, body.capacity, version)
        return Joined(worker_id=member_id, lease_s=config.worker_lease_s, heartbeat_s=config.worker_lease_s / 4,
                      version=version, snapshot_source=SNAPSHOT_PREFIX)

    async def beat(self, member_id: str, body: Beat) -> BeatReply:
        """Renew the lease, take the version it holds; tell it the newest (and where a full copy is)."""
        member = self._member(member_id)
        member.version = body.version
        member.lease_expires = time.monotonic() + self.live.config.worker_lease_s
        newest = self.pool.published_version
        snapshot, peers = None, []
        if body.version is None or body.version < newest:
            if not self.publisher.can_follow(body.version, newest):
                snapshot = await self.publisher.snapshot()
            peers = [m.address for m in self.pool.remote_members() if m.id != member_id and m.phase == "active"
                     and m.version == newest and m.address][:_PEERS]
        return BeatReply(version=newest, state=member.state(newest, self.live.config), snapshot_version=snapshot,
                         peers=peers)

    def leave(self, member_id: str) -> None:
        """The worker is leaving: no new calls; those running finish (it waits for them)."""
        member = self._member(member_id)
        member.phase = "draining"
        log.info("worker %s is leaving (draining)", member_id)

    def drain(self, member_id: str, reason: str) -> None:
        member = self.pool.members.get(member_id)
        if member is not None and member.remote and member.phase == "active":
            member.phase = "draining"
            log.warning("worker %s drained: %s", member_id, reason)

    def sweep(self) -> int:
        """Drop members whose lease ran out; forget long-dropped ones. How many were dropped now."""
        now = time.monotonic()
        dropped = 0
        for member in list(self.pool.members.values()):
            if not member.remote:
                continue
            if member.phase != "dropped" and now > member.lease_expires:
                self.pool.drop(member.id, f"no heartbeat for {self.live.config.worker_lease_s:g} s")
                dropped += 1
            if member.phase == "dropped":
                since = self._dropped_at.setdefault(member.id, now)
                if now - since > _FORGET_DROPPED_S:
                    del self.pool.members[member.id]
                    del self._dropped_at[member.id]
        return dropped

    async def run_sweeper(self, every_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                self.sweep()
            except Exception:  # the sweeper must survive a bug in one pass
                log.exception("pool sweep failed")

    async def disseminate(self, version: int, weights: Weights | None, *, overlap: bool = False) -> None:
        """Send ``version`` to the active members (module docstring); its figures go to the pool's
        ``last_publication`` when the push ends. With ``overlap`` (async mode) this returns once the
        version is encoded, and the push runs on while the next step trains. ``weights`` None: the
        local generator took them as a stream (NCCL), so they are exported from the trainer, and only
        when an active member is there to take them (a GPU learner without workers gathers nothing)."""
        await self.settle()  # one push at a time, and the chain is chosen from the versions it left
        config = self.live.config
        active = [m for m in self.pool.remote_members() if m.phase == "active"]
        if not active:
            self.publisher.reset()
            self.pool.last_publication = self._counts(config)
            return
        full = self.publisher.full_next(version, config.full_sync_every)
        base = self.publisher.base_version
        chain = [m for m in active if full or (m.version is not None and m.version == base)]
        try:
            if weights is None:
                weights = await self._exported(version)
            encoded = await self.publisher.stage(version, weights, full)
        except Exception:  # the members catch up from the snapshot; training goes on
            log.exception("preparing version %d for the workers failed; they catch up by heartbeat", version)
            self.pool.last_publication = {**self._counts(config), _FAILED: 1.0}
            return
        push = self._push(encoded, chain, config)
        if overlap:
            self._pushing = asyncio.ensure_future(push)
        else:
            await push

    async def settle(self) -> None:
        """Wait for a push still running (``overlap``), so its members' versions and figures are in."""
        pushing, self._pushing = self._pushing, None
        if pushing is not None:
            await pushing

    async def close(self) -> None:
        """Stop a push still running (the server is going down; workers catch up from the next one)."""
        pushing, self._pushing = self._pushing, None
        if pushing is not None and not pushing.done():
            pushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pushing

    async def _push(self, encoded: Encoded, chain: list[Member], config: PoolConfig) -> None:
        try:
            sent = await self.publisher.relay(encoded, [m.address or "" for m in chain],
                                              timeout_s=config.disseminate_timeout_s)
        except Exception:  # the members catch up from the snapshot; training goes on
            log.exception("disseminating version %d failed; workers catch up by heartbeat", encoded.version)
            self.pool.last_publication = {**self._counts(config), _FAILED: 1.0}
            return
        for member in chain:  # the chain reports a member once it has loaded the version
            if member.address in sent.reached and member.phase == "active":
                member.version = max(member.version or -1, encoded.version)
        self.pool.last_publication = {
            "perf/disseminate_s": sent.seconds, "perf/disseminate_bytes": float(sent.bytes_sent),
            "pool/version_bytes": float(sent.total_bytes), "pool/full_sync": float(sent.kind == "full"),
            "pool/chain_failed": float(len(sent.failed)), "pool/disseminated_version": float(encoded.version),
            **self._counts(config)}

    async def _exported(self, version: int) -> Weights:
        """``version``'s weights from the trainer (``Publisher.export``: one trainer-thread call)."""
        if self.publisher.export is None:
            raise RuntimeError("the local generator streams its weights and the publisher has no export")
        exported, weights = await self.publisher.export()
        if exported != version:
            raise RuntimeError(f"the trainer exported version {exported} while version {version} was published")
        return weights

    def _counts(self, config: PoolConfig) -> dict[str, float]:
        states = [w.state for w in self.pool.workers() if w.id != "local"]
        return {"pool/ready": float(states.count("ready")), "pool/syncing": float(states.count("syncing")),
                "pool/workers": float(len(states) - states.count("dropped"))}

    def _member(self, member_id: str) -> Member:
        member = self.pool.members.get(member_id)
        if member is None or not member.remote or member.phase == "dropped":
            raise UnknownWorker(f"no worker {member_id} in the pool (dropped after a missed lease, or never "
                                "joined): join again")
        return member
