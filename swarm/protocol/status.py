"""Status and metrics: episode counts, the server's state, workers, per-step metrics.
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["ConfigDefaults", "DiskStatus", "EpisodeCounts", "LastError", "RecentCounts", "SamplingCounts", "ServerState",
           "Status", "StepMetrics", "WorkerState", "WorkerStatus"]

class EpisodeCounts(BaseModel):
    """Training episodes. ``dropped_stale``: of ``dropped``, those older than ``max_staleness`` at their
    step; ``refused_stale``: claims and first chat calls answered 429 because they could not have
    finished within ``max_staleness`` (``swarm.server.flow.admission``; since the process started, a retry
    refused again counts again)."""

    claimed: int = 0
    finished: int = 0
    aborted: int = 0
    expired: int = 0
    trained: int = 0
    dropped: int = 0
    dropped_stale: int = 0
    refused_stale: int = 0


class RecentCounts(BaseModel):
    """``EpisodeCounts`` over the last ``window_s`` seconds (``swarm status`` judges the drop rate by them)."""

    window_s: float = 60.0
    finished: int = 0
    dropped: int = 0
    dropped_stale: int = 0
    refused_stale: int = 0


class DiskStatus(BaseModel):
    """The filesystem under the server's state dir. ``full``: claims are refused (507) because free space
    is below ``reserve_bytes`` (the room kept for in-flight episodes to finish), or because a write
    failed for want of space and no more has come free since; ``reason`` says which. Finishes, steps
    and checkpoints still try their writes and answer 507 or retry only when those fail."""

    full: bool = False
    free_bytes: int = 0
    reserve_bytes: int = 0
    reason: str = ""


class SamplingCounts(BaseModel):
    """Training chat calls that sent a ``temperature`` or ``top_p`` other than the config's (the training
    values), since the process started: ``honoured`` sampled as sent (``client_sampling = "honor"``; many
    such calls can tie a GRPO group's rewards), ``overridden`` held at the training values (``"pin"``)."""

    honoured: int = Field(0, description="sampled at the client's values (client_sampling = honor)")
    overridden: int = Field(0, description="held at the config's temperature/top_p (client_sampling = pin)")


class ServerState(str, Enum):
    starting = "starting"
    running = "running"
    training = "training"
    paused = "paused"
    stopping = "stopping"
    stopped = "stopped"


class LastError(BaseModel):
    """The newest error the server survived (also published as an ``error`` event): ``where`` is the
    stage (``train_step``, ``publish``, ``checkpoint``), ``at`` a Unix time."""

    where: str
    message: str
    at: float


WorkerState = Literal["syncing", "ready", "draining", "dropped"]


class WorkerStatus(BaseModel):
    """One member of the server's generator pool in ``GET /api/v1/status`` (``id`` "local": the
    server's own generator). ``state``: ``syncing`` (joined, does not hold a version it may serve
    yet), ``ready`` (gets traffic), ``draining`` (leaving, or its log-probs disagree with the
    trainer's), ``dropped`` (missed its lease or stopped answering)."""

    id: str
    engine: str
    version: int | None = None
    state: WorkerState
    tokens_per_s: float = 0.0
    address: str | None = None
    in_flight: int = 0
    capacity: int = 0
    logprob_diff_max: float | None = None


class ConfigDefaults(BaseModel):
    """Which defaults filled the config keys that no ``--config`` file or flag set when the server
    started: ``built-in`` (``ServerConfig``'s, measured on the tiny presets) or ``model-scaled``
    (``swarm.defaults.server_defaults`` for a pretrained model; ``keys`` holds the values taken).
    ``resumed``: the server resumed a state dir whose stored config stands instead (a ``--config`` and
    these defaults only seed a fresh state dir)."""

    source: Literal["built-in", "model-scaled"] = "built-in"
    keys: dict[str, Any] = Field(default_factory=dict)
    resumed: bool = False


class Status(BaseModel):
    """``GET /api/v1/status``."""

    state: ServerState
    model: str
    policy_version: int
    step: int
    episodes: EpisodeCounts
    groups_pending: int = 0
    groups_dropped_uniform: int = Field(0, description="groups dropped because their rewards were all equal "
                                        "(batch_mode=varied_groups, DAPO's dynamic sampling), since the process "
                                        "started; their episodes are in dropped and drop_reasons")
    clients: int = 0
    config_version: int = 0
    throughput: dict[str, float] = Field(default_factory=dict)
    uptime_s: float = 0.0
    generator: dict[str, Any] = Field(default_factory=dict, description="the generator's engine and health")
    last_error: LastError | None = Field(None, description="the newest error training survived, if any")
    workers: list[WorkerStatus] = Field(default_factory=list, description="the generator pool's members")
    drop_reasons: dict[str, int] = Field(default_factory=dict, description="dropped episodes by reason")
    refusal_reasons: dict[str, int] = Field(default_factory=dict, description="refused_stale by reason")
    recent: RecentCounts = Field(default_factory=RecentCounts, description="counts over the last minute")
    defaults: ConfigDefaults = Field(default_factory=ConfigDefaults, description="which defaults the config "
                                     "started from where nothing set a key")
    disk: DiskStatus | None = Field(None, description="free space under the state dir; full: claims answer 507")
    client_sampling: SamplingCounts = Field(default_factory=SamplingCounts, description="training calls whose "
                                            "temperature/top_p differed from the config's: honoured or overridden")


class StepMetrics(BaseModel):
    """One training step's metrics; keys are slash-named (``train/reward_mean``)."""

    step: int
    policy_version: int
    time: float
    metrics: dict[str, float]
