"""Episode records and GRPO groups: who is in which group, and when a group is ready to train.

A group is the episodes sharing a ``group_id`` (default: the task id). It expects ``size`` members;
it is *complete* once that many were claimed and all of them are terminal. A complete group is
trainable when at least ``min_group_size`` members finished (failed members are skipped), otherwise
it is dropped. Claims beyond a group's size open a fresh group with the same id, so a client that
runs the same task again later gets a new group rather than joining a closed one.

Held-out evaluation episodes (``purpose="eval"``) join no group: their rounds are
``swarm.server.episodes.evaluation``'s. A dropped episode carries its reason everywhere it is counted (the
buffer, the status' ``drop_reasons``); ``stale_reason`` names the drop of one older than ``max_staleness``.

``batch_mode = "varied_groups"`` is DAPO's dynamic sampling: a complete group whose finished members
all got the same reward has an advantage of 0 everywhere under GRPO (nothing to learn, only a smaller
effective batch), so it is dropped when it completes (``UNIFORM_REASON``) and the step waits for
``batch_groups`` groups that do differ. ``GroupBook`` counts those groups for the status
(``groups_dropped_uniform``) and each step's ``train/groups_dropped_uniform``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Literal

from swarm.backends.base import TrainSample
from swarm.protocol import EPISODE_TRANSITIONS, EpisodeState, FinishRequest, Purpose
from swarm.server.records.timeline import EpisodeTrace
from swarm.text.drift import ReplyBook

_STALE = "older than max_staleness"
SMALL_REASON = "group below min_group_size"
UNIFORM_REASON = "rewards identical (batch_mode=varied_groups)"


def stale_reason(max_staleness: int) -> str:
    """The drop reason of an episode older than ``max_staleness`` versions at its step."""
    return f"{_STALE}={max_staleness}"


def is_stale(reason: str) -> bool:
    """Whether a drop ``reason`` is staleness (the status counts those as ``dropped_stale``)."""
    return reason.startswith(_STALE)


@dataclass
class Claim:
    """What a claim fixed when it was made and the lease that keeps it alive. The policy ``version``
    and trainer ``step`` it started from never change; ``expires_at`` (the view's clock) moves
    ``lease_s`` ahead on every heartbeat or chat call, and a claim past it expires."""

    version: int
    step: int
    lease_s: float
    expires_at: float

    def renew(self, now: float) -> None:
        """A sign of life (a heartbeat, a chat call, a finish held for disk space): ``lease_s`` from ``now``."""
        self.expires_at = now + self.lease_s


@dataclass(frozen=True)
class Place:
    """Its place in the work, which keys its sampling noise in deterministic mode
    (``swarm.backends.noise``): the same task claimed in the same order draws the same noise in every
    run, where the random episode id would not."""

    task_round: int = 0  # groups of its task id this server started before its group
    member: int = 0  # its index within its group (claim order); an eval episode's among its task's in the round
    coin_key: str = ""  # what ``random_reward``'s coin is drawn from (empty: the episode id)


@dataclass
class EpisodeRecord:
    """Everything the server knows about one episode. The constructor takes what its claim decided;
    the fields after ``place`` are its life since (always at their defaults when it is claimed)."""

    episode_id: str
    task_id: str
    group_key: str
    group_id: str
    category: str | None
    client_id: str
    trace: EpisodeTrace
    claim: Claim
    purpose: Purpose = "train"
    place: Place = field(default_factory=Place)
    state: EpisodeState = field(init=False, default=EpisodeState.claimed)
    finish: FinishRequest | None = field(init=False, default=None)
    abort_reason: str | None = field(init=False, default=None)
    # the view's clock at its first chat call, which fixed its version
    first_call_at: float | None = field(init=False, default=None)
    # chat calls begun on this episode (an eval call's fixed seed counts them)
    calls_started: int = field(init=False, default=0)
    # sampled ids of every reply returned (drift repair)
    replies: ReplyBook = field(init=False, default_factory=ReplyBook)
    # the pool member that generated its calls; "" once several did (not kept durably)
    source: str | None = field(init=False, default=None)

    def samples(self, advantage: float, version: int) -> list[TrainSample]:
        """Its training samples; those sampled by policy ``version`` (the trainer's now) are tagged
        with the pool member that generated them (when only one did): their log-prob mismatch is then
        the member's own, not staleness."""
        samples = self.trace.samples(advantage)
        if not self.source:
            return samples
        return [replace(s, source=self.source) if set(s.policy_versions) == {version} else s for s in samples]

    def generated_by(self, member: str | None) -> None:
        """Note which pool member served a call (per-member log-prob mismatch needs one per sample)."""
        if member is not None:
            self.source = member if self.source in (None, member) else ""

    @property
    def is_eval(self) -> bool:
        return self.purpose == "eval"

    @property
    def reward(self) -> float | None:
        return self.finish.reward if self.finish is not None else None

    def move(self, target: EpisodeState) -> None:
        """Change state along ``protocol.EPISODE_TRANSITIONS`` only."""
        if target not in EPISODE_TRANSITIONS[self.state]:
            raise ValueError(f"episode {self.episode_id}: {self.state.value} -> {target.value} is not allowed")
        self.state = target


@dataclass
class Group:
    """One GRPO group instance."""

    key: str  # unique across instances of the same group_id
    group_id: str
    size: int
    category: str | None
    members: list[EpisodeRecord] = field(default_factory=list)
    serial: int = 0  # claim order among this server's groups (canonical step order)
    task_round: int = 0  # see ``Place.task_round``

    @property
    def full(self) -> bool:
        return len(self.members) >= self.size

    @property
    def complete(self) -> bool:
        return self.full and all(m.state is not EpisodeState.claimed for m in self.members)

    @property
    def finished(self) -> list[EpisodeRecord]:
        return [m for m in self.members if m.state is EpisodeState.finished]

    def varied(self) -> bool:
        rewards = {m.reward for m in self.finished}
        return len(rewards) > 1

    def trainable(self, *, min_group_size: int, varied_only: bool) -> bool:
        """Whether a complete group may train (live, and after a restart): see ``untrainable_reason``."""
        return self.untrainable_reason(min_group_size=min_group_size, varied_only=varied_only) is None

    def untrainable_reason(self, *, min_group_size: int, varied_only: bool) -> str | None:
        """The one rule for whether a complete group may train, as the reason it may not (None: it
        may): enough members finished (a group smaller than ``min_group_size`` by design, a client's
        ``group_size``, still can) and, with ``varied_only``, their rewards differ."""
        if len(self.finished) < min(min_group_size, self.size):
            return SMALL_REASON
        return UNIFORM_REASON if varied_only and not self.varied() else None


Verdict = Literal["open", "ready", "dropped", "uniform"]
# Why the members of a group that settled with a dropping verdict are set aside.
DROP_REASONS: dict[str, str] = {"dropped": SMALL_REASON, "uniform": UNIFORM_REASON}


class GroupBook:
    """Open groups by id, and the FIFO of complete, trainable groups waiting for a step. ``canonical``
    (deterministic mode): a step takes the ready groups in claim order, not in the order they completed."""

    def __init__(self, *, canonical: bool = False) -> None:
        self.canonical = canonical
        self._open: dict[str, Group] = {}
        self.ready: list[Group] = []
        self._serial = itertools.count(1)
        self.dropped_uniform = 0  # groups dropped for identical rewards since the process started
        self._uniform_reported = 0  # of those, already in a step's metrics

    def join(self, group_id: str, size: int, category: str | None) -> Group:
        """The open group for ``group_id`` with room left, or a new one of ``size``."""
        group = self._open.get(group_id)
        if group is None or group.full:
            serial = next(self._serial)
            group = Group(key=f"{group_id}#{serial}", group_id=group_id, size=size, category=category, serial=serial)
            self._open[group_id] = group
        return group

    def is_new(self, group_id: str) -> bool:
        group = self._open.get(group_id)
        return group is None or group.full

    def settle(self, group: Group, *, min_group_size: int, varied_only: bool) -> Verdict:
        """Called when a member reaches a terminal state: file the group if it is now complete."""
        if not group.complete:
            return "open"
        if self._open.get(group.group_id) is group:
            del self._open[group.group_id]
        reason = group.untrainable_reason(min_group_size=min_group_size, varied_only=varied_only)
        if reason == UNIFORM_REASON:
            self.dropped_uniform += 1
            return "uniform"
        if reason is not None:
            return "dropped"
        self.ready.append(group)
        return "ready"

    def take_dropped_uniform(self) -> int:
        """Groups dropped for identical rewards since the last call (a step's ``train/groups_dropped_uniform``)."""
        count, self._uniform_reported = self.dropped_uniform - self._uniform_reported, self.dropped_uniform
        return count

    def take(self, count: int) -> list[Group]:
        taken, self.ready = self.ready[:count], self.ready[count:]
        return taken

    def put_back(self, groups: list[Group]) -> None:
        """A batch that could not train now (no room to reserve its version) waits at the front."""
        self.ready[:0] = groups

    def ready_episodes(self) -> int:
        return sum(len(g.finished) for g in self.ready)

    def batch_ready(self, batch_mode: str, batch_groups: int, group_size: int) -> bool:
        """A step may fire: ``batch_groups`` ready groups, or (``episodes`` mode) as many episodes
        as ``batch_groups`` full groups hold."""
        if batch_mode == "episodes":
            return self.ready_episodes() >= batch_groups * group_size
        return len(self.ready) >= batch_groups

    def take_batch(self, batch_mode: str, batch_groups: int, group_size: int) -> list[Group]:
        """The groups of one step, oldest first (whole groups, also in ``episodes`` mode): first
        completed first, or with ``canonical`` first claimed first."""
        if self.canonical:
            self.ready.sort(key=lambda group: group.serial)
        if batch_mode != "episodes":
            return self.take(batch_groups)
        target, taken, count = batch_groups * group_size, 0, 0
        for group in self.ready:
            count += 1
            taken += len(group.finished)
            if taken >= target:
                break
        return self.take(count)
