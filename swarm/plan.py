"""Capacity planning: how many clients, at what concurrency, keep the learner busy (ECHO-2's rule).

ECHO-2 overlaps rollout generation with training under a bounded staleness and provisions rollout
capacity so the learner never waits: over ``κ`` training steps the workers must deliver ``κ·R``
rollouts in the training time left after the weight broadcast,

    sum of rollout throughputs  ≥  κ·R / (κ·T_train − T_bcast)

with ``R`` episodes per update, ``T_train`` the update time and ``T_bcast`` the weight broadcast.
ECHO-2's staleness ``S`` counts the version being trained, so its ``κ ≈ S − 1`` is this server's
``max_staleness`` (the number of versions a sample may lag). For a utilisation target ``b < 1`` the
learner may spend ``T_train / b`` per step, which replaces ``T_train`` above. In sync mode nothing
overlaps: rollouts fill the time between updates, so ``R / X ≤ T_train·(1/b − 1) − T_bcast``.

The inputs are the server's own live figures (``perf/*`` over the last steps), so the advice is for
this model, this task and these clients, not a guess; it assumes a client's throughput scales with
its concurrency, which holds while the client's time goes to waiting on the server or on its agent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from swarm.protocol import Status, StepMetrics

WINDOW = 5  # recent steps averaged: a single step is noisy, a long window lags a change of clients
# The rule gives the throughput at which the learner is *exactly* at its target; episodes arrive in whole
# groups and per-client throughput grows less than linearly with concurrency (the clients share the
# server's generator), so the advice provisions this much more.
HEADROOM = 1.5


class NotEnoughData(ValueError):
    """The server has not trained enough steps (or never saw a client) to measure its capacity."""


@dataclass(frozen=True)
class Figures:
    """What the server measured over its last steps."""

    learner_busy: float          # fraction of wall time spent updating (perf/learner_busy)
    train_s: float               # update time per step, broadcast excluded
    broadcast_s: float           # weight publication per step (perf/weight_sync_s)
    episodes_per_step: float     # R
    eps_per_client: float        # episodes/s one client delivers (perf/rollout_eps_per_client)
    clients: int                 # clients holding episodes now
    concurrency: float           # episodes each client has in flight now
    steps: int                   # steps averaged
    tokens_per_episode: float = 0.0  # generated tokens one episode costs (context/generated_tokens / train/episodes)
    disseminate_s: float = 0.0   # of broadcast_s: the pool workers' share (perf/disseminate_s)


@dataclass(frozen=True)
class Advice:
    """The provisioning rule applied to ``Figures`` for one target."""

    mode: Literal["async", "sync"]
    staleness: int
    target_busy: float
    required_eps: float | None   # episodes/s all clients together must deliver (None: target unreachable)
    current_eps: float
    clients_needed: int | None   # at today's per-client concurrency
    concurrency_needed: int | None  # per client, with today's number of clients (both with HEADROOM)
    enough: bool
    reason: str
    figures: Figures
    staleness_needed: int | None = None  # async: the max_staleness the advised episodes in flight need

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(metrics: Sequence[StepMetrics], *, clients: int, in_flight: int, window: int = WINDOW) -> Figures:
    """Average the last ``window`` steps' perf figures; ``in_flight`` is the claimed-episode count."""
    metrics = [m for m in metrics if m.step > 0]  # row 0 holds a held-out evaluation only
    recent = [m.metrics for m in metrics[-window:]]
    if len(recent) < 2:
        raise NotEnoughData(f"the server has trained {len(metrics)} step(s); capacity needs at least 2")

    def mean(key: str, default: float | None = None) -> float:
        values = [m[key] for m in recent if key in m]
        if not values:
            if default is None:
                raise NotEnoughData(f"the server reports no {key}: is it older than `swarm plan`?")
            return default
        return sum(values) / len(values)

    broadcast = mean("perf/weight_sync_s", 0.0)
    eps_per_client = mean("perf/rollout_eps_per_client")
    if eps_per_client <= 0:
        raise NotEnoughData("no client finished episodes in the last steps; start clients first")
    n = max(clients, 1)
    episodes = mean("train/episodes")
    return Figures(learner_busy=mean("perf/learner_busy"), train_s=max(mean("perf/step_s") - broadcast, 1e-6),
                   broadcast_s=broadcast, episodes_per_step=episodes, eps_per_client=eps_per_client,
                   clients=n, concurrency=max(in_flight / n, 1.0), steps=len(recent),
                   tokens_per_episode=mean("context/generated_tokens", 0.0) / max(episodes, 1e-9),
                   disseminate_s=mean("perf/disseminate_s", 0.0))


def required_eps(figures: Figures, *, mode: str, staleness: int, target_busy: float) -> float | None:
    """Episodes/s the clients must deliver together for the learner to stay ``target_busy``; None when
    no rollout capacity reaches it (sync mode with a broadcast longer than the allowed idle time)."""
    step_time = figures.train_s / target_busy  # the time one step may take, waiting included
    r = figures.episodes_per_step
    if mode == "sync":
        window = step_time - figures.train_s - figures.broadcast_s
        return r / window if window > 0 else None
    kappa = max(staleness, 1)
    window = kappa * step_time - figures.broadcast_s
    return kappa * r / window if window > 0 else None


def advise(figures: Figures, *, mode: Literal["async", "sync"], staleness: int, target_busy: float) -> Advice:
    """Apply the provisioning rule: how many clients, or how much concurrency each, reach ``target_busy``."""
    if not 0 < target_busy < 1:
        raise ValueError(f"--target-busy must be in (0, 1), got {target_busy}")
    if staleness < 0:
        raise ValueError(f"--staleness must be ≥ 0, got {staleness}")
    needed = required_eps(figures, mode=mode, staleness=staleness, target_busy=target_busy)
    current = figures.eps_per_client * figures.clients
    enough = figures.learner_busy >= target_busy
    if needed is None:
        return Advice(mode, staleness, target_busy, None, current, None, None, enough,
                      "no number of clients reaches this target in sync mode: the weight broadcast alone takes "
                      "longer than the learner may idle; use mode=async or a lower --target-busy", figures)
    # The rule assumes episodes arrive evenly. A learner that is supply-bound is busy ``current·T_train/R`` of
    # the time, so the measured idle gives a second estimate, ``current·target/busy``; advise the larger (bursty
    # clients need it). Where the learner is already busy enough, today's throughput is what keeps it so.
    observed = current * target_busy / max(figures.learner_busy, 0.01)
    needed = max(needed, current) if enough else max(needed, observed)
    provision = needed * HEADROOM if not enough else needed
    clients = math.ceil(provision / figures.eps_per_client)
    concurrency = math.ceil(figures.concurrency * provision / current)
    reason = (f"learner busy {figures.learner_busy:.2f} (target {target_busy:.2f}); clients deliver "
              f"{current:.2f} episodes/s, the rule asks for {needed:.2f}")
    in_flight = math.ceil(figures.concurrency * provision / figures.eps_per_client)
    return Advice(mode, staleness, target_busy, needed, current, clients, concurrency, enough, reason, figures,
                  staleness_needed(in_flight, figures.episodes_per_step) if mode == "async" else None)


def staleness_needed(in_flight: int, episodes_per_step: float) -> int:
    """The ``max_staleness`` under which ``in_flight`` episodes still train: an episode claimed now
    trains about ``in_flight / R`` steps later, so more than ``(S + 1)·R`` in flight are dropped as stale."""
    return max(math.ceil(in_flight / max(episodes_per_step, 1.0)) - 1, 0)


DROP_ALERT = 0.05  # ``swarm status`` names a fix when more of the last minute's finished episodes were dropped
_STALE = "older than max_staleness"  # how the server names a drop for staleness (``episodes.stale_reason``)


def drop_fix(status: Status, config: Mapping[str, Any]) -> str | None:
    """One line for ``swarm status`` when more than ``DROP_ALERT`` of the last minute's finished
    episodes were dropped: why, and what to change (``config``: the server's live values); else None."""
    recent = status.recent
    if not recent.finished or recent.dropped <= DROP_ALERT * recent.finished:
        return None
    share = (f"{recent.dropped / recent.finished:.0%} of the last minute's {recent.finished} finished episodes "
             "were dropped")
    if 2 * recent.dropped_stale < recent.dropped:  # mostly for another reason
        others = sorted(((n, r) for r, n in status.drop_reasons.items() if not r.startswith(_STALE)), reverse=True)
        reasons = "; ".join(f"{reason}: {n}" for n, reason in others[:3])
        return (f"{share} ({reasons}): lower min_group_size, or use batch_mode=groups where groups are too "
                "small or alike; a failed step is in last_error")
    staleness, group_size = int(config.get("max_staleness", 1)), int(config.get("group_size", 1))
    batch = int(config.get("batch_groups", 1)) * group_size
    held = int(status.throughput.get("in_flight", 0)) + status.groups_pending * group_size
    fixes = [f"raise max_staleness (`swarm config max_staleness={max(staleness_needed(held, batch), staleness + 1)}`)",
             f"lower the clients' --concurrency (below {(staleness + 1) * batch} episodes in flight and waiting)"]
    if not config.get("admission", True):
        fixes.insert(0, "turn admission on (`swarm config admission=true`: work that could not train in time "
                        "is refused instead of generated)")
    return f"{share} as older than max_staleness={staleness}: " + ", or ".join(fixes)


def describe(advice: Advice) -> list[str]:
    """The advice as lines for people."""
    f = advice.figures
    lines = [f"learner busy {f.learner_busy:.2f} over the last {f.steps} steps (target {advice.target_busy:.2f}); "
             f"update {f.train_s:.2f} s + broadcast {f.broadcast_s:.2f} s for {f.episodes_per_step:.0f} episodes a step",
             f"clients: {f.clients} with about {f.concurrency:.0f} episode(s) in flight each, "
             f"{f.eps_per_client:.2f} episodes/s per client, {advice.current_eps:.2f} in all"]
    if advice.required_eps is None:
        return [*lines, advice.reason]
    lines.append(f"needed ({advice.mode}, staleness {advice.staleness}): {advice.required_eps:.2f} episodes/s")
    if advice.enough:
        return [*lines, "enough: the learner is already at its target"]
    lines.append(f"advice: {advice.clients_needed} clients at today's concurrency, "
                 f"or --concurrency {advice.concurrency_needed} on each of today's {f.clients} client(s)")
    if advice.staleness_needed is not None and advice.staleness_needed > advice.staleness:
        lines.append(f"that many episodes in flight need max_staleness ≥ {advice.staleness_needed} "
                     f"(at {advice.staleness} the oldest are dropped as stale): `swarm config "
                     f"max_staleness={advice.staleness_needed}`")
    return lines


# --------------------------------------------------------------------------- the generator pool


@dataclass(frozen=True)
class WorkerFigure:
    """One pool member as ``/api/v1/status`` lists it under ``workers``."""

    id: str
    engine: str
    state: str
    tokens_per_s: float  # what it generated per second of serving, recently (0: not measured yet)


@dataclass(frozen=True)
class PoolAdvice:
    """ECHO-2's rule carried to the generator pool: the episodes/s the learner needs, in tokens/s."""

    required_tokens_per_s: float | None  # None: no rate reaches the target (see ``Advice.reason``)
    pool_tokens_per_s: float             # the ready workers' measured rates together
    keep: list[str]                      # the fastest ready workers that cover the requirement
    deactivate: list[str]                # ready workers beyond it: cost without throughput the learner uses
    unmeasured: list[str]                # ready workers with no rate yet (neither kept nor dropped)
    add: int                             # more workers of ``add_engine`` the requirement needs
    add_engine: str | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def advise_pool(advice: Advice, workers: Sequence[WorkerFigure]) -> PoolAdvice:
    """Which workers keep the learner at its target: the generator must produce the advised episodes/s
    times the tokens one episode costs (the dissemination time is already in the broadcast term).

    The rate of a worker (μ_i) is what it produced per second while serving, which assumes it keeps
    that rate with more requests in flight; it is an upper bound on a saturated worker's share and an
    underestimate on an idle one, so the advice keeps the fastest workers first and names the rest."""
    ready = sorted((w for w in workers if w.state == "ready"), key=lambda w: -w.tokens_per_s)
    measured = [w for w in ready if w.tokens_per_s > 0]
    unmeasured = [w.id for w in ready if w.tokens_per_s <= 0]
    pool = sum(w.tokens_per_s for w in measured)
    per_episode = advice.figures.tokens_per_episode
    if advice.required_eps is None or per_episode <= 0:
        why = advice.reason if advice.required_eps is None else "no generated-token figures yet (context/generated_tokens)"
        return PoolAdvice(None, pool, [w.id for w in measured], [], unmeasured, 0, None, why)
    needed = advice.required_eps * per_episode * (1.0 if advice.enough else HEADROOM)
    keep, covered = [], 0.0
    for worker in measured:
        if covered >= needed:
            break
        keep.append(worker.id)
        covered += worker.tokens_per_s
    add, engine = 0, None
    if covered < needed:
        rates: dict[str, list[float]] = {}
        for worker in measured:
            rates.setdefault(worker.engine, []).append(worker.tokens_per_s)
        if rates:
            engine, best = max(((e, sum(r) / len(r)) for e, r in rates.items()), key=lambda item: item[1])
            add = math.ceil((needed - covered) / best)
    reason = (f"the learner needs {needed:.0f} generated tokens/s ({advice.required_eps:.2f} episodes/s × "
              f"{per_episode:.0f} tokens); the ready workers measure {pool:.0f} tokens/s")
    return PoolAdvice(needed, pool, keep, [w.id for w in measured if w.id not in keep], unmeasured, add, engine, reason)


def describe_pool(pool: PoolAdvice, disseminate_s: float) -> list[str]:
    """The pool advice as lines for people."""
    lines = [pool.reason]
    if disseminate_s > 0:
        lines.append(f"dissemination to the workers takes {disseminate_s:.2f} s a step (in the broadcast term)")
    if pool.required_tokens_per_s is None:
        return lines
    if pool.add:
        lines.append(f"workers: add {pool.add} `swarm worker --engine {pool.add_engine}` (the fastest kind here)")
    if pool.deactivate:
        lines.append(f"workers: {', '.join(pool.deactivate)} add cost but no throughput the learner needs; "
                     "stop them (SIGTERM leaves cleanly)")
    if pool.unmeasured:
        lines.append(f"workers not measured yet: {', '.join(pool.unmeasured)}")
    if not pool.add and not pool.deactivate:
        lines.append(f"workers: the {len(pool.keep)} ready worker(s) cover it")
    return lines
