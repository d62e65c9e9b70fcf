"""Held-out evaluation: eval episodes, their rounds, and the ``eval/*`` metrics a round publishes.

An eval episode (``ClaimRequest.purpose="eval"``) is served like any other but joins no group, is
neither throttled nor counted in the buffer counts, and is never recorded, stored or trained. Its
reward goes to the round of the step it was claimed at. So that a round evaluates exactly one
policy, an eval claim arriving while a step trains waits for that step to end (and no new step
starts meanwhile), and a step waits for the live eval episodes (in both modes; sync mode admits
eval claims while a batch waits for its drain, since the drain waits for them).

Publication: the moment a round's last live episode ends, its ``eval/*`` metrics are merged into
the metrics row of the step whose policy it evaluated (``StepRows.add``): that is the newest
committed step, since no step starts while a round is live, and row 0 for the untrained policy.
The merge adds ``eval/episodes_total``, that step's cumulative episodes (0 for row 0): the x of a
chart per episode consumed, logged at exactly the round's steps (MLflow pairs x and y by position).
The row is written to the durable buffer at once, so ``/api/v1/metrics``, the MLflow writer and a
restarted server all see it, also when it ends after the run's last training step; an
``eval.finished`` event tells the readers that keep a per-step cursor (the MLflow writer) to send
that row again. A later round of the same step pools with it (more samples of the same policy).

Aligned rounds: a client's eval claims say how often it evaluates (``ClaimRequest.eval_every``).
The step after each multiple of that cadence then waits until a round of the multiple has been
claimed (``config.eval_hold_s`` at most, so a client that stopped evaluating cannot stall training),
so every run of a study evaluates at exactly steps 0, k, 2k, … and curves averaged over runs line up.

What a crash loses: the rounds still live (their episodes are in memory only), never a published
one, and nothing of training.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from swarm.protocol import ClaimRequest, EpisodeState
from swarm.server.records.episode import Claim, EpisodeRecord, Place
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.records.timeline import EpisodeTrace
from swarm.server.view import ServerView

__all__ = ["EvalBook", "EvalRound", "Evaluation", "StepRowBook"]


class StepRowBook(Protocol):
    """Where a round's metrics go: the metrics row of the step it evaluated
    (``swarm.server.training.step_rows.StepRows``)."""

    def add(self, step: int, extra: dict[str, float]) -> object:
        """Merge ``extra`` into the row of ``step`` (creating it), durable at once."""


@dataclass
class EvalRound:
    """The held-out episodes claimed while the server was at ``step``: how many are still live, how many
    each task had claimed (a task's n-th sample draws its own noise), and the rewards of those that finished
    (aborted and expired ones leave no reward), by task."""

    step: int
    live: int = 0
    rewards: list[float] = field(default_factory=list)
    claims: Counter[str] = field(default_factory=Counter)
    by_task: dict[str, list[float]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """``eval/*`` metrics of a round with rewards; ``eval/step`` names the policy evaluated. Where a task
        was sampled more than once (``swarm run --eval-samples``), ``eval/reward_mean_sd``: the sampling
        noise of ``eval/reward_mean`` with the weights fixed, sqrt(s² / n) from the pooled within-task
        variance s² (the problems are the same every round, so only the sampling varies)."""
        n = len(self.rewards)
        mean = sum(self.rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / n)
        out = {"eval/reward_mean": mean, "eval/reward_std": std, "eval/episodes": float(n),
               "eval/step": float(self.step)}
        df = sum(len(r) - 1 for r in self.by_task.values() if r)
        if df > 0:
            within = sum(sum((x - sum(r) / len(r)) ** 2 for x in r) for r in self.by_task.values() if r) / df
            out["eval/reward_mean_sd"] = math.sqrt(within / n)
        return out


class EvalBook:
    """Held-out rounds by step: which are live, and which just ended.

    A round of a step stays here after it ends, so a later round of the same step pools with it;
    rounds of older steps are forgotten when a newer step's round begins. In memory only."""

    def __init__(self) -> None:
        self._rounds: dict[int, EvalRound] = {}

    @property
    def live(self) -> int:
        return sum(r.live for r in self._rounds.values())

    def has(self, step: int) -> bool:
        """Whether a round of ``step`` was claimed (it may have ended)."""
        return step in self._rounds

    def claimed(self, step: int, task_id: str = "") -> int:
        """An eval episode of ``task_id`` claimed at ``step``; returns its sample index: how many of that
        task the round (pooled over the step's rounds) had claimed before it."""
        for old in [s for s, r in self._rounds.items() if s < step and not r.live]:
            del self._rounds[old]
        round_ = self._rounds.setdefault(step, EvalRound(step))
        round_.live += 1
        round_.claims[task_id] += 1
        return round_.claims[task_id] - 1

    def ended(self, step: int, reward: float | None, task_id: str = "") -> EvalRound | None:
        """An eval episode of ``step`` left CLAIMED; the round if that was its last live episode."""
        round_ = self._rounds[step]
        round_.live -= 1
        if reward is not None:
            round_.rewards.append(reward)
            round_.by_task.setdefault(task_id, []).append(reward)
        return round_ if round_.live == 0 else None


class Evaluation:
    """The held-out side: eval claims, their rounds, and the rounds' publication into the step rows
    (``rows.add(step, metrics)``). When an eval claim may come in (between steps, admitted) is the
    server core's and the step loop's to say."""

    def __init__(self, view: ServerView, *, episodes: EpisodeRegistry, rows: StepRowBook) -> None:
        self._view = view
        self._episodes = episodes
        self._rows = rows
        self.book = EvalBook()
        self.every = 0  # the cadence the latest eval claim declared (0: unknown, no step is held)

    @property
    def live(self) -> int:
        """Eval episodes still CLAIMED (a step waits for them)."""
        return self.book.live

    def due(self, step: int) -> bool:
        """Step ``step`` is one the clients evaluate at and no round of it has been claimed yet (the
        next step waits for one, see ``StepLoop.can_step``)."""
        return self.every > 0 and step > 0 and step % self.every == 0 and not self.book.has(step)

    def claim(self, request: ClaimRequest) -> EpisodeRecord:
        """A held-out eval episode of the current step's policy."""
        view = self._view
        if request.eval_every is not None:
            self.every = request.eval_every
        config = view.config
        lease_s = request.lease_s or config.lease_s
        claim = Claim(version=view.policy_version, step=view.step, lease_s=lease_s, expires_at=view.clock() + lease_s)
        episode = EpisodeRecord(
            episode_id=uuid.uuid4().hex, task_id=request.task_id, group_key="", group_id=request.task_id,
            category=request.category, client_id=request.client_id,
            trace=EpisodeTrace(merge=config.merge_timelines), claim=claim, purpose="eval",
        )
        self._episodes.add_claimed(episode, None, request.request_id)
        episode.place = Place(member=self.book.claimed(claim.step, request.task_id))  # its sample: its own noise
        view.emit("episode.claimed", episode_id=episode.episode_id, task_id=request.task_id, group_id=None,
                  category=request.category, client_id=request.client_id, purpose="eval", step=claim.step)
        return episode

    def ended(self, episode: EpisodeRecord, state: EpisodeState) -> None:
        """An eval episode left CLAIMED (its reward counts if it finished); the round it completed,
        if any, is published. A round whose every episode failed publishes nothing."""
        reward = episode.reward if state is EpisodeState.finished else None
        round_ = self.book.ended(episode.claim.step, reward, episode.task_id)
        if round_ is not None and round_.rewards:
            metrics = round_.metrics()
            self._rows.add(round_.step, metrics)
            self._view.emit("eval.finished", step=round_.step, metrics=metrics)
