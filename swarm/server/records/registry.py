"""The episodes the core holds in memory, indexed by id, by claim request and by liveness.

The core decides what happens to an episode; this registry only answers "which episodes exist
here, and where": the held ones (claimed, or finished and waiting to be trained), the live
(CLAIMED) subset with each one's group (none for a held-out eval episode), claim request ids for
idempotent retries, and a bounded set of tombstones so a late call on an aborted/expired episode
still gets a clear 409/410. Trained and dropped episodes are evicted (the durable store keeps them),
so memory stays bounded over days.
"""

from __future__ import annotations

from collections import OrderedDict

from swarm.server.records.episode import EpisodeRecord, Group
from swarm.server.records.timeline import EpisodeTrace

__all__ = ["EpisodeRegistry"]


class EpisodeRegistry:
    def __init__(self, max_tombstones: int = 50_000) -> None:
        self._held: dict[str, EpisodeRecord] = {}
        self._group_of: dict[str, Group | None] = {}  # the live (CLAIMED) episodes -> their groups (eval: None)
        self._requests: dict[str, str] = {}  # claim request_id -> episode_id
        self._request_of: dict[str, str] = {}  # episode_id -> its claim request_id (for eviction)
        self._tombstones: OrderedDict[str, EpisodeRecord] = OrderedDict()  # closed, trace-free
        self._max_tombstones = max_tombstones

    # ------------------------------------------------------------------ adding

    def add_claimed(self, episode: EpisodeRecord, group: Group | None, request_id: str | None) -> None:
        self._held[episode.episode_id] = episode
        self._group_of[episode.episode_id] = group
        if request_id is not None:
            self._requests[request_id] = episode.episode_id
            self._request_of[episode.episode_id] = request_id

    def add_finished(self, episode: EpisodeRecord) -> None:
        """A finished episode restored from the durable buffer: held until trained, never live."""
        self._held[episode.episode_id] = episode

    # ------------------------------------------------------------------ lookups

    def by_request(self, request_id: str | None) -> EpisodeRecord | None:
        """The episode an earlier claim with this ``request_id`` created (a retried claim)."""
        episode_id = self._requests.get(request_id) if request_id is not None else None
        return self._held.get(episode_id) if episode_id is not None else None

    def held(self, episode_id: str) -> EpisodeRecord | None:
        return self._held.get(episode_id)

    def get(self, episode_id: str) -> EpisodeRecord | None:
        """A held episode, or the tombstone of a closed one."""
        return self._held.get(episode_id) or self._tombstones.get(episode_id)

    def group_of(self, episode_id: str) -> Group:
        group = self._group_of[episode_id]
        if group is None:
            raise KeyError(f"episode {episode_id} is an eval episode: it has no group")
        return group

    def live(self) -> list[EpisodeRecord]:
        return [self._held[episode_id] for episode_id in self._group_of]

    @property
    def in_flight(self) -> int:
        return len(self._group_of)

    def live_training(self) -> tuple[int, int]:
        """Live training episodes, and the groups they are in (eval episodes excluded)."""
        groups = [g.key for g in self._group_of.values() if g is not None]
        return len(groups), len(set(groups))

    # ------------------------------------------------------------------ leaving

    def settle(self, episode: EpisodeRecord) -> Group | None:
        """The episode left CLAIMED (finished, aborted, expired): drop it from the live set; its
        group (``None`` for an eval episode)."""
        return self._group_of.pop(episode.episode_id)

    def evict(self, episode: EpisodeRecord) -> None:
        """Forget a trained/dropped/closed episode; the durable store has its copy."""
        self._held.pop(episode.episode_id, None)
        request_id = self._request_of.pop(episode.episode_id, None)
        if request_id is not None:
            self._requests.pop(request_id, None)

    def bury(self, episode: EpisodeRecord) -> None:
        """An aborted/expired episode (or a finished eval one): evict it but keep a trace-free
        tombstone (bounded, oldest out)."""
        episode.trace = EpisodeTrace(merge=episode.trace.merge)
        self.evict(episode)
        self._tombstones[episode.episode_id] = episode
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)
