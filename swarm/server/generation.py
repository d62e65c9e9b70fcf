"""``LocalGenerator``: the ``Generator`` role for a model that lives in the server process.

It adapts a synchronous ``Backend`` (the torch engine) to the engine's async generator contract:
requests go to the ``DeviceWorker`` (which batches them continuously on the device thread), and
published weights are loaded on that same thread, between generations. When the generator and the
trainer are one torch backend (the default), publishing finds the weights already in place and only
moves the version; when they are separate models, it copies the trainer's tensors in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swarm.backends.base import Backend, Sampled, SamplingParams, TokenSink, Weights
from swarm.server.device_worker import DeviceWorker, WorkerStats


class LocalGenerator:
    """A ``Generator`` over an in-process backend and its device thread."""

    reports_top_logprobs = True  # the torch sampler fills ``Generation.top_logprobs`` (see its docstring)

    def __init__(self, backend: Backend, worker: DeviceWorker) -> None:
        self.backend = backend
        self.worker = worker
        self.text = backend.text
        self.model_name = backend.model_name
        self.max_context = backend.max_context
        self.eos_token_id = backend.eos_token_id

    @property
    def policy_version(self) -> int:
        return self.backend.policy_version

    @property
    def available(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"engine": "torch", "alive": True, "policy_version": self.policy_version}

    @property
    def stats(self) -> WorkerStats:
        return self.worker.stats

    def render_prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[int]:
        return self.backend.render_prompt(messages, tools)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.backend.decode(token_ids)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text)

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None) -> Sampled:
        return await self.worker.submit(prompts, params, sink)

    async def load_weights(self, version: int, weights: Weights) -> None:
        load = getattr(self.backend, "load_weights", None)
        if load is None:
            raise TypeError(f"{type(self.backend).__name__} cannot load published weights")
        await self.worker.call(lambda: load(version, weights))

    async def start(self) -> None:
        """Nothing to start: the app owns the device thread (the torch trainer may share it)."""

    async def close(self) -> None:
        """Nothing to stop (see ``start``)."""
