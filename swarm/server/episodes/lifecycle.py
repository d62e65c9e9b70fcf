"""Episodes after their claim: heartbeats, finish, abort, lease expiry, and what an ending does to
its group (complete, or dropped below ``min_group_size``) or to its held-out round.

``Lifecycle`` is the server core's episode side. A finished training episode is committed to the durable
buffer before ``finish`` returns; a retried finish with the same body is a no-op and a different
one a 409, also for an episode already trained and evicted (the store answers then); aborted,
expired and dropped episodes are recorded too (best effort). Ended episodes leave memory through
the ``EpisodeRegistry`` (a bounded tombstone keeps a late call's answer clear). The core gives it
the registry, the group book, the store, the counters, the capacity meter, the disk monitor, the held-out
rounds (``evals``: an eval episode that ends ends its round, ``swarm.server.episodes.evaluation``) and the
step loop's ``wake`` event (a step may have a batch now). A committed step hands back its episodes
(``trained``): counted, and evicted from memory.

A finish whose commit fails for want of space (``swarm.server.durability.diskspace``) is a 507 with
``retry_after``: the episode stays CLAIMED and unacknowledged, its lease is renewed (the client is
alive and retrying), and the same finish sent again once space is back commits it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import partial

from swarm.protocol import AbortRequest, EpisodeCounts, EpisodeState, EpisodeStatus, FinishRequest
from swarm.server.durability.diskspace import RETRY_AFTER_S, DiskMonitor, is_disk_full
from swarm.server.durability.store import EpisodeConflict, EpisodeStore, StoreError, store_safely
from swarm.server.episodes.evaluation import Evaluation
from swarm.server.errors import BadRequest, Conflict, Gone, InsufficientStorage, NotFound
from swarm.server.flow.capacity import CapacityMeter
from swarm.server.records.episode import DROP_REASONS, EpisodeRecord, Group, GroupBook, is_stale
from swarm.server.records.finished import FinishedEpisode, Outcome
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.view import ServerView

__all__ = ["Lifecycle"]


class Lifecycle:
    """Heartbeats, finishes, aborts and expiries of claimed episodes (see the module docstring)."""

    def __init__(self, view: ServerView, *, episodes: EpisodeRegistry, groups: GroupBook, store: EpisodeStore,
                 counts: EpisodeCounts, capacity: CapacityMeter, disk: DiskMonitor, evals: Evaluation,
                 wake: asyncio.Event) -> None:
        self._view = view
        self.episodes = episodes
        self.groups = groups
        self.store = store
        self.counts = counts
        self.capacity = capacity
        self.disk = disk
        self._evals = evals
        self._wake = wake
        self.drop_reasons: Counter[str] = Counter()  # every drop, by reason (``tally_drops``)

    def get(self, episode_id: str) -> EpisodeRecord:
        episode = self.episodes.get(episode_id)
        if episode is None:
            raise NotFound(f"unknown episode {episode_id}")
        return episode

    def status_of(self, episode_id: str) -> EpisodeStatus:
        try:
            episode = self.get(episode_id)
        except NotFound:
            stored = self.store.get(episode_id)  # finished and already trained or dropped (evicted)
            if stored is None:
                if self.store.known(episode_id):  # pruned by retention: finished, its reward gone with its row
                    return EpisodeStatus(episode_id=episode_id, state=EpisodeState.finished)
                raise
            return EpisodeStatus(episode_id=episode_id, state=EpisodeState.finished, reward=stored.outcome.reward)
        lease = episode.claim.expires_at if episode.state is EpisodeState.claimed else None
        return EpisodeStatus(episode_id=episode_id, state=episode.state, lease_expires_at=lease,
                             reward=episode.reward)

    def live(self, episode_id: str) -> EpisodeRecord:
        """A CLAIMED episode (heartbeat, chat calls); a clear 4xx for any other state."""
        episode = self.get(episode_id)
        if episode.state is EpisodeState.expired:
            raise Gone(f"episode {episode_id} expired (no heartbeat within its {episode.claim.lease_s:g} s lease); "
                       "its trace was discarded: claim a new episode")
        if episode.state is not EpisodeState.claimed:
            raise Conflict(f"episode {episode_id} is already {episode.state.value}")
        return episode

    def heartbeat(self, episode_id: str) -> EpisodeStatus:
        episode = self.live(episode_id)
        episode.claim.renew(self._view.clock())
        return self.status_of(episode_id)

    def finish(self, episode_id: str, body: FinishRequest) -> EpisodeStatus:
        try:
            episode = self.get(episode_id)
        except NotFound:
            return self._finish_evicted(episode_id, body)
        if episode.state is EpisodeState.finished:
            if episode.finish == body:
                return self.status_of(episode_id)
            raise Conflict(f"episode {episode_id} was already finished with a different body "
                           f"(reward {episode.reward}); a finish is final")
        self.live(episode_id)
        episode.finish = body
        if episode.is_eval:  # its reward goes to its round; nothing is stored (a crash loses the round only)
            self._terminate(episode, EpisodeState.finished)
            self.episodes.bury(episode)  # the tombstone answers a retried finish
            self._view.emit("episode.finished", episode_id=episode_id, reward=body.reward, group_id=None,
                      purpose="eval", step=episode.claim.step)
            return self.status_of(episode_id)
        try:
            self._persist_finished(episode, self.episodes.group_of(episode_id))
        except Exception as exc:
            episode.finish = None  # nothing changed: the client may retry
            if is_disk_full(exc):
                raise self._no_room(episode, exc) from None
            raise
        self.disk.succeeded()
        self._terminate(episode, EpisodeState.finished)
        self.counts.finished += 1
        began = episode.first_call_at  # the episode's duration as staleness sees it: from its version on
        self.capacity.episode_finished(episode.client_id, None if began is None else self._view.clock() - began)
        self._view.emit("episode.finished", episode_id=episode_id, reward=body.reward, group_id=episode.group_id)
        return self.status_of(episode_id)

    def _no_room(self, episode: EpisodeRecord, exc: Exception) -> InsufficientStorage:
        """The 507 of a finish that could not be committed; the episode's lease is renewed meanwhile."""
        episode.claim.renew(self._view.clock())
        self.disk.failed("committing a finished episode", exc)
        return InsufficientStorage(
            f"the disk under the server's state dir is full ({exc}): episode {episode.episode_id} was not stored "
            "and is still open; send the same finish again after Retry-After",
            detail=self.disk.check().model_dump(), retry_after=min(RETRY_AFTER_S, episode.claim.lease_s / 3))

    def _finish_evicted(self, episode_id: str, body: FinishRequest) -> EpisodeStatus:
        """A retried finish of an episode already trained (evicted) or from before a restart: the
        same body is the usual no-op, a different one a 409; an episode never finished is a 404. One
        retention pruned (``swarm.server.durability.store_pruned``) has no body left to compare: any retried
        finish of it is accepted as the no-op (``finished``, no reward), never stored again."""
        stored = self.store.get(episode_id)
        if stored is None and self.store.known(episode_id):
            return EpisodeStatus(episode_id=episode_id, state=EpisodeState.finished)
        if stored is None:
            raise NotFound(f"unknown episode {episode_id} (never claimed here, or it was still running when "
                           "the server restarted: claim a new episode)")
        if stored.outcome != _outcome(body):
            raise Conflict(f"episode {episode_id} was already finished with a different body "
                           f"(reward {stored.outcome.reward}); a finish is final")
        return EpisodeStatus(episode_id=episode_id, state=EpisodeState.finished, reward=stored.outcome.reward)

    def abort(self, episode_id: str, body: AbortRequest) -> EpisodeStatus:
        episode = self.get(episode_id)
        if episode.state is EpisodeState.aborted:
            return self.status_of(episode_id)
        self.live(episode_id)
        episode.abort_reason = body.reason
        self._terminate(episode, EpisodeState.aborted)
        if not episode.is_eval:
            self.counts.aborted += 1
            store_safely("record abort", lambda: self.store.record_closed(episode_id, "aborted", body.reason))
        self.episodes.bury(episode)
        self._view.emit("episode.aborted", episode_id=episode_id, reason=body.reason)
        return self.status_of(episode_id)

    def expire_stale(self) -> int:
        """Expire every CLAIMED episode whose lease ran out; its partial trace is discarded."""
        now = self._view.clock()
        stale = [e for e in self.episodes.live() if e.claim.expires_at < now]
        for episode in stale:
            self._terminate(episode, EpisodeState.expired)
            if not episode.is_eval:
                self.counts.expired += 1
                store_safely("record expiry", partial(self.store.record_closed, episode.episode_id, "expired",
                                                      "no heartbeat within the lease"))
            self.episodes.bury(episode)
            self._view.emit("episode.expired", episode_id=episode.episode_id, client_id=episode.client_id)
        return len(stale)

    def _terminate(self, episode: EpisodeRecord, state: EpisodeState) -> None:
        episode.move(state)
        group = self.episodes.settle(episode)
        if group is None:  # an eval episode: its round, not a group
            self._evals.ended(episode, state)
            self._wake.set()  # a step may have waited for this round
            return
        verdict = self.groups.settle(group, min_group_size=self._view.config.min_group_size,
                                      varied_only=self._view.config.batch_mode == "varied_groups")
        if verdict in DROP_REASONS:  # too few finished, or (varied_groups) identical rewards
            self.drop(group.finished, DROP_REASONS[verdict])
        self._wake.set()

    def drop(self, episodes: list[EpisodeRecord], reason: str) -> None:
        """Set finished episodes aside untrained, for ``reason`` (counted, and recorded in the buffer);
        those no longer held (trained or dropped already) are skipped."""
        episodes = [e for e in episodes if self.episodes.held(e.episode_id) is not None]
        if not episodes:
            return
        self.tally_drops(len(episodes), reason)
        ids = [e.episode_id for e in episodes]
        store_safely("record drop", lambda: self.store.mark_dropped(ids, reason))
        for episode in episodes:
            self.episodes.evict(episode)

    def trained(self, kept: list[EpisodeRecord], stale: list[EpisodeRecord], reason: str) -> None:
        """A step committed: count its episodes (the stale ones as dropped for ``reason``); they leave
        memory (the store keeps the durable copy)."""
        self.counts.trained += len(kept)
        self.tally_drops(len(stale), reason)
        for episode in (*kept, *stale):
            self.episodes.evict(episode)

    def tally_drops(self, count: int, reason: str) -> None:
        """Count ``count`` dropped episodes under ``reason``: every drop, here or at a step, goes
        through this one tally (``dropped``, ``dropped_stale``, ``drop_reasons``, the recent window)."""
        if count <= 0:
            return
        stale = is_stale(reason)
        self.counts.dropped += count
        self.counts.dropped_stale += count if stale else 0
        self.drop_reasons[reason] += count
        self.capacity.dropped(count, stale=stale)

    def _persist_finished(self, episode: EpisodeRecord, group: Group) -> None:
        """Commit a finished episode to the durable buffer before ``finish`` returns."""
        assert episode.finish is not None
        record = FinishedEpisode.from_trace(
            episode.trace, episode_id=episode.episode_id, task_id=episode.task_id, group_id=episode.group_id,
            group_key=episode.group_key, group_size=group.size, category=episode.category,
            client_id=episode.client_id, outcome=_outcome(episode.finish), finished_at=self._view.clock())
        try:
            self.store.save_finished(record)
        except EpisodeConflict as exc:
            raise Conflict(str(exc)) from None
        except StoreError as exc:
            raise BadRequest(f"this finish cannot be stored: {exc}") from None


def _outcome(body: FinishRequest) -> Outcome:
    """The stored form of a finish body (plain dicts, as the durable buffer reads them back)."""
    return Outcome(reward=body.reward, metrics=dict(body.metrics), metadata=dict(body.metadata))
