"""Claim admission: whether an episode may be claimed now, and the record a claim creates.

A claim is refused with 429 + ``retry_after`` (never queued) while the server stops or is paused,
in sync mode while a weight update waits for in-flight episodes to drain, and when it would start
a group of a category ahead of its configured ratio (``CategoryThrottle``). A training claim joins
the open group of its ``group_id`` (or starts one); an eval claim is ``Evaluation``'s and waits for
a running step instead (``swarm.server.evaluation``). A retried claim (same ``request_id``) answers
with the episode the first one created.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from swarm.protocol import ClaimRequest, Episode, ServerState
from swarm.server.episodes import EpisodeRecord
from swarm.server.errors import RetryLater
from swarm.server.throttle import CategoryThrottle
from swarm.server.timeline import EpisodeTrace

if TYPE_CHECKING:
    from swarm.server.engine import Engine

__all__ = ["Claims"]


class Claims:
    """The engine's claim side; the episodes it creates are the engine's."""

    def __init__(self, engine: Engine, category_ratios: dict[str, float]) -> None:
        self._engine = engine
        self._throttle = CategoryThrottle(category_ratios)

    def reset_throttle(self, category_ratios: dict[str, float]) -> None:
        """New ratios (a live config change, a restore): the group counts start over."""
        self._throttle.reset(category_ratios)

    async def claim_between_steps(self, request: ClaimRequest, base_url: str) -> Episode:
        """``claim``, but an eval claim that arrives while a step trains waits for it to end."""
        if request.purpose == "eval":
            await self._engine.evals.between_steps()
        return self.claim(request, base_url)

    def claim(self, request: ClaimRequest, base_url: str) -> Episode:
        retried = self._engine.episodes.by_request(request.request_id)
        if retried is not None:
            return self.view(retried, base_url)
        episode = self._engine.evals.claim(request) if request.purpose == "eval" else self._train(request)
        return self.view(episode, base_url)

    def _train(self, request: ClaimRequest) -> EpisodeRecord:
        engine = self._engine
        self.admit()
        group_id = request.group_id or request.task_id
        starts_group = engine.groups.is_new(group_id)
        if starts_group and not self._throttle.allows(request.category):
            raise RetryLater(f"category {request.category!r} is ahead of its configured ratio; "
                             "claim a task of another category or retry later", retry_after=1.0)
        group = engine.groups.join(group_id, request.group_size or engine.config.group_size, request.category)
        if starts_group:
            self._throttle.started(request.category)
        lease_s = request.lease_s or engine.config.lease_s
        episode = EpisodeRecord(
            episode_id=uuid.uuid4().hex, task_id=request.task_id, group_key=group.key, group_id=group_id,
            category=request.category, client_id=request.client_id, lease_s=lease_s,
            lease_expires_at=engine.clock() + lease_s, trace=EpisodeTrace(merge=engine.config.merge_timelines),
            claimed_version=engine.policy_version, claimed_step=engine.step,
        )
        group.members.append(episode)
        engine.episodes.add_claimed(episode, group, request.request_id)
        engine.counts.claimed += 1
        engine.emit("episode.claimed", episode_id=episode.episode_id, task_id=request.task_id,
                    group_id=group_id, category=request.category, client_id=request.client_id)
        return episode

    def admit(self, *, evaluating: bool = False) -> None:
        """Refuse new claims (429) while paused, or in sync mode while a batch waits for a drain
        (``evaluating``: an eval claim, which that drain waits for instead)."""
        engine = self._engine
        if engine.state in (ServerState.stopping, ServerState.stopped):
            raise RetryLater("the server is stopping", retry_after=5.0)
        if engine.paused:
            raise RetryLater("the server is paused; claims resume after POST /api/v1/control/resume",
                             retry_after=2.0)
        if evaluating:
            return
        if engine.config.mode == "sync" and (engine.loop.training or engine.batch_ready()):
            raise RetryLater("sync mode: a weight update is pending while in-flight episodes finish",
                             retry_after=0.5)

    def view(self, episode: EpisodeRecord, base_url: str) -> Episode:
        """The claim's answer: where to call and with which key (the same for a retried claim)."""
        return Episode(
            episode_id=episode.episode_id, base_url=base_url,
            api_key=self._engine.keys.episode_key(episode.episode_id),
            policy_version=episode.claimed_version, lease_expires_at=episode.lease_expires_at,
            task_id=episode.task_id, group_id=episode.group_id, category=episode.category,
            purpose=episode.purpose, step=episode.claimed_step,
        )
