"""Claim admission: whether an episode may be claimed now, and the record a claim creates.

A claim is refused with 429 + ``retry_after`` (never queued) while the server stops or is paused,
in sync mode while a weight update waits for in-flight episodes to drain, when it would start
a group of a category ahead of its configured ratio (``CategoryThrottle``), and when a new group
could not train within ``max_staleness`` (``swarm.server.flow.admission``). A training claim joins
the open group of its ``group_id`` (or starts one); an eval claim is ``Evaluation``'s and waits for
a running step instead (``swarm.server.episodes.evaluation``). A retried claim (same ``request_id``) answers
with the episode the first one created. ``ServerCore.claim`` runs these checks in that order; this
module holds the training side (throttle, group, record) and the claim's answer. Each record notes its
place in the work (its task's round, its index in its group), which keys its sampling noise in
deterministic mode (``swarm.backends.noise``).
"""

from __future__ import annotations

import uuid
from collections import Counter

from swarm.protocol import ClaimRequest, Episode
from swarm.server.auth import KeyRing
from swarm.server.errors import RetryLater
from swarm.server.flow.admission import Admission
from swarm.server.flow.category_mix import CategoryThrottle
from swarm.server.records.episode import Claim, EpisodeRecord, GroupBook, Place
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.records.timeline import EpisodeTrace
from swarm.server.view import ServerView

__all__ = ["Claims"]


class Claims:
    """The claim side of training episodes: the group a claim joins and the record it creates.
    Pause, stop, sync-mode drains and counting are the server core's; the staleness bound is ``admission``'s."""

    def __init__(self, view: ServerView, *, keys: KeyRing, episodes: EpisodeRegistry, groups: GroupBook,
                 category_ratios: dict[str, float], admission: Admission, deterministic: bool = False) -> None:
        self._view = view
        self._deterministic = deterministic
        self._task_rounds: Counter[str] = Counter()  # groups started per task id (since this process started)
        self._admission = admission
        self._keys = keys
        self._episodes = episodes
        self._groups = groups
        self._throttle = CategoryThrottle(category_ratios)

    def reset_throttle(self, category_ratios: dict[str, float]) -> None:
        """New ratios (a live config change, a restore): the group counts start over."""
        self._throttle.reset(category_ratios)

    def open(self, request: ClaimRequest) -> EpisodeRecord:
        """A new training episode in the open group of its ``group_id`` (or a new group, if its
        category is not ahead of its ratio and admission lets it start: else 429)."""
        config = self._view.config
        group_id = request.group_id or request.task_id
        starts_group = self._groups.is_new(group_id)
        if starts_group and not self._throttle.allows(request.category):
            raise RetryLater(f"category {request.category!r} is ahead of its configured ratio; "
                             "claim a task of another category or retry later", retry_after=1.0)
        size = request.group_size or config.group_size
        if starts_group:
            self._admission.claim(request.client_id, size)
        group = self._groups.join(group_id, size, request.category)
        if starts_group:
            self._throttle.started(request.category)
            group.task_round = self._task_rounds[request.task_id]
            self._task_rounds[request.task_id] += 1
        lease_s = request.lease_s or config.lease_s
        member = len(group.members)
        coin_key = f"{request.task_id}\0{group.task_round}\0{member}" if self._deterministic else ""
        claim = Claim(version=self._view.policy_version, step=self._view.step, lease_s=lease_s,
                      expires_at=self._view.clock() + lease_s)
        episode = EpisodeRecord(
            episode_id=uuid.uuid4().hex, task_id=request.task_id, group_key=group.key, group_id=group_id,
            category=request.category, client_id=request.client_id,
            trace=EpisodeTrace(merge=config.merge_timelines), claim=claim,
            place=Place(task_round=group.task_round, member=member, coin_key=coin_key),
        )
        group.members.append(episode)
        self._episodes.add_claimed(episode, group, request.request_id)
        return episode

    def view(self, episode: EpisodeRecord, base_url: str) -> Episode:
        """The claim's answer: where to call and with which key (the same for a retried claim)."""
        return Episode(
            episode_id=episode.episode_id, base_url=base_url,
            api_key=self._keys.episode_key(episode.episode_id),
            policy_version=episode.claim.version, lease_expires_at=episode.claim.expires_at,
            task_id=episode.task_id, group_id=episode.group_id, category=episode.category,
            purpose=episode.purpose, step=episode.claim.step,
        )
