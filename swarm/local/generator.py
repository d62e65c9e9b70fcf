"""``LocalGenerator``: the ``Generator`` role for a model that lives in the server process.

It adapts a synchronous ``Sampler`` (the torch backend) to the server's async ``Generator`` contract:
requests go to the ``DeviceWorker`` (which batches them continuously on the device thread), and
published weights are loaded on that same thread, between generations. When the generator and the
trainer are one torch backend (the default), publishing finds the weights already in place and only
moves the version; when they are separate models, it copies the trainer's tensors in. Text
(rendering, encoding, decoding) is the sampler's ``ChatText``, shared, not wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm.backends.base import Generator, Sampled, Sampler, SamplingParams, TokenSink, Weights
from swarm.local.device_worker import DeviceWorker


class LocalGenerator(Generator):
    """A ``Generator`` over an in-process sampler and its device thread."""

    reports_top_logprobs = True  # the torch sampler fills ``Generation.top_logprobs`` (see its docstring)

    def __init__(self, backend: Sampler, worker: DeviceWorker) -> None:
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

    def describe(self) -> dict[str, object]:
        return {"engine": "torch", "alive": True, "policy_version": self.policy_version,
                "device": getattr(self.backend, "device", "cpu"), "dtype": getattr(self.backend, "dtype", "float32")}

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        return await self.worker.submit(prompts, params, sink)  # one engine: ``affinity`` changes nothing

    async def load_weights(self, version: int, weights: Weights) -> None:
        await self.worker.call(lambda: self.backend.load_weights(version, weights))

    async def start(self) -> None:
        """Nothing to start: the app owns the device thread (the torch trainer may share it)."""

    async def close(self) -> None:
        """Nothing to stop (see ``start``)."""
