"""Multi-model teams: one rollout holds an episode on each of several servers (docs/guides/agents.md,
"Multi-model teams").

A planner model and a worker model trained on separate servers share one rollout: the episodes are
claimed together, and they finish together (each with its own or a shared reward) or abort together.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from swarm.client._client import SwarmClient
from swarm.client._episode import EpisodeHandle
from swarm.client._errors import SwarmError
from swarm.protocol import Purpose

log = logging.getLogger(__name__)


class TeamRollout:
    """The episodes of one team rollout, by role (``rollout["planner"]``)."""

    def __init__(self, episodes: dict[str, EpisodeHandle]) -> None:
        self.episodes = episodes

    def __getitem__(self, role: str) -> EpisodeHandle:
        return self.episodes[role]

    @property
    def done(self) -> bool:
        return all(ep.done for ep in self.episodes.values())

    def finish(self, reward: float | Mapping[str, float], metrics: dict[str, float] | None = None,
               metadata: dict[str, Any] | None = None) -> None:
        """Finish every role's episode: one shared reward, or a reward per role (all roles required)."""
        rewards = dict(reward) if isinstance(reward, Mapping) else {role: reward for role in self.episodes}
        missing = sorted(set(self.episodes) - set(rewards))
        extra = sorted(set(rewards) - set(self.episodes))
        if missing or extra:
            raise ValueError(f"rewards must name exactly the roles {sorted(self.episodes)} "
                             f"(missing {missing}, unknown {extra})")
        for role, episode in self.episodes.items():
            episode.finish(float(rewards[role]), metrics=metrics, metadata=metadata)

    def abort(self, reason: str = "aborted by client") -> None:
        for episode in self.episodes.values():
            episode.abort(reason)

    def _close(self, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc is not None or not self.done:
                reason = f"team rollout failed: {type(exc).__name__}: {exc}" if exc else "finished without reward"
                self.abort(reason)  # a partly finished team still aborts the rest: nothing is left claimed
        finally:
            for episode in self.episodes.values():
                episode.close()


class SwarmTeam:
    """Several swarm servers, one per trained model, addressed by role."""

    def __init__(self, clients: Mapping[str, SwarmClient]) -> None:
        if not clients:
            raise ValueError("a team needs at least one role")
        self.clients = dict(clients)

    @contextmanager
    def rollout(self, task_id: str, *, group_id: str | None = None, group_size: int | None = None,
                category: str | None = None, lease_s: float | None = None,
                purpose: Purpose = "train") -> Iterator[TeamRollout]:
        """Claim one episode per role; an exception or a missing ``finish`` aborts all of them.
        ``purpose="eval"``: a held-out evaluation rollout (nothing of it is trained on any server)."""
        claimed: dict[str, EpisodeHandle] = {}
        try:
            for role, client in self.clients.items():
                claimed[role] = client.claim(task_id, group_id=group_id, group_size=group_size,
                                             category=category, lease_s=lease_s, purpose=purpose)
        except SwarmError:
            TeamRollout(claimed)._close(RuntimeError("claim failed"), None)
            raise
        team = TeamRollout(claimed)
        try:
            yield team
        except BaseException as exc:
            team._close(exc, exc.__traceback__)
            raise
        team._close(None, None)
