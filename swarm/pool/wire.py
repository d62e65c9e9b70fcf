"""The pool's wire contract, imported by both ends: the server and its ``swarm worker`` processes.

Two conversations: a worker's membership with the server (``POST /api/v1/workers`` to join, a
heartbeat, ``DELETE`` to leave) and the server's generation calls to a worker (``POST
/pool/v1/generate``: token ids in, token ids + log-probs + the version that produced them out,
optionally as an NDJSON stream of tokens so a call cut short by a dead worker can be continued
elsewhere from exactly the tokens already produced). Pydantic only, like ``swarm.protocol``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from swarm.backends.base import Generation, Sampled, SamplingParams

WORKERS_PATH = "/api/v1/workers"
GENERATE_PATH = "/pool/v1/generate"
HEALTH_PATH = "/pool/v1/health"


class Join(BaseModel):
    """``POST /api/v1/workers``: a worker asks to join the pool."""

    model_config = ConfigDict(extra="forbid")

    engine: str = Field(..., min_length=1, max_length=32, description="torch or vllm")
    address: str = Field(..., min_length=8, max_length=512, description="base URL the server reaches it at")
    capacity: int = Field(8, ge=1, le=4096, description="rows it generates at once")
    model: str = Field("", max_length=512, description="what it was started with (for people)")


class Joined(BaseModel):
    """The answer to ``Join``: its id, how often to heartbeat, and the version to load first
    (a full snapshot of it is held by the server's snapshot depot)."""

    worker_id: str
    lease_s: float
    heartbeat_s: float
    version: int | None = Field(None, description="the newest published version (None: none yet)")
    snapshot_source: str = Field("", description="relay source (under the server URL) holding full snapshots")


class Beat(BaseModel):
    """``POST /api/v1/workers/{id}/heartbeat``: what the worker holds and how busy it is."""

    model_config = ConfigDict(extra="forbid")

    version: int | None = None
    in_flight: int = Field(0, ge=0)
    tokens_per_s: float = Field(0.0, ge=0)


class WorkerHealth(BaseModel):
    """``GET /pool/v1/health``: what a worker holds and does (for people and benchmarks)."""

    worker_id: str | None = Field(description="None until the server has taken it in")
    version: int | None = Field(description="the policy version it serves (None: still syncing)")
    in_flight: int
    produced_tokens: int = Field(description="tokens generated since it started")
    leaving: bool
    engine: str


class BeatReply(BaseModel):
    """The newest version (a worker behind it catches up) and the worker's state as the server sees it."""

    version: int | None
    state: Literal["syncing", "ready", "draining", "dropped"]
    snapshot_version: int | None = Field(None, description="the version the snapshot source holds in full")
    peers: list[str] = Field(default_factory=list, description="members that hold ``version`` (relay addresses): "
                             "a worker catching up takes the chunks from them and the manifest from the server")


class WireParams(BaseModel):
    """``SamplingParams`` on the wire (same fields, same meaning)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(..., ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = Field(0, ge=0, le=20)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    logit_bias: list[tuple[int, float]] = Field(default_factory=list)
    noise_key: int | None = Field(None, ge=0, lt=2**64)
    batch_invariant: bool = True
    grammar: str | None = Field(None, min_length=1)  # a constrained row: the worker applies the same mask

    @classmethod
    def of(cls, params: SamplingParams) -> WireParams:
        return cls.model_validate(asdict(params))

    def sampling(self) -> SamplingParams:
        values = self.model_dump()
        values["stop"], values["stop_token_ids"] = tuple(self.stop), tuple(self.stop_token_ids)
        values["logit_bias"] = tuple((int(t), float(b)) for t, b in self.logit_bias)
        return SamplingParams(**values)


class GenerateRequest(BaseModel):
    """``POST /pool/v1/generate``: one row per prompt; ``stream``: answer as NDJSON token lines."""

    model_config = ConfigDict(extra="forbid")

    prompts: list[list[int]] = Field(..., min_length=1, max_length=4096)
    params: list[WireParams] = Field(..., min_length=1, max_length=4096)
    stream: bool = False


class WireGeneration(BaseModel):
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    top_logprobs: list[list[tuple[int, float]]] | None = None

    def generation(self) -> Generation:
        return Generation(token_ids=self.token_ids, logprobs=self.logprobs, finish_reason=self.finish_reason,
                          top_logprobs=self.top_logprobs)


class GenerateResult(BaseModel):
    """The rows and the policy version of the weights that produced them."""

    generations: list[WireGeneration]
    policy_version: int

    @classmethod
    def of(cls, sampled: Sampled) -> GenerateResult:
        return cls(generations=[WireGeneration(**asdict(g)) for g in sampled.generations],
                   policy_version=sampled.policy_version)

    def sampled(self, source: str | None = None) -> Sampled:
        return Sampled(generations=[g.generation() for g in self.generations], policy_version=self.policy_version,
                       source=source)


class StreamLine(BaseModel):
    """One NDJSON line of a streamed generation: a token ``t`` = (row, id, log-prob, top alternatives),
    the final ``done``, or an ``error`` (``status`` as HTTP would have answered)."""

    t: tuple[int, int, float, list[tuple[int, float]] | None] | None = None
    done: GenerateResult | None = None
    error: str | None = None
    status: int | None = None
