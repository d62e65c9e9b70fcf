"""``RemoteWorker``: the server's client of one ``swarm worker`` process (``POST /pool/v1/generate``).

Every call streams (NDJSON token lines), whether or not the caller streams: the pool then knows the
exact tokens a worker produced before it died and continues from them elsewhere (``swarm.pool.stitch``).
Failures are sorted at this boundary into three kinds, because the pool answers each differently:
``ValueError`` (the worker refused the request as invalid: the caller's mistake, a 400),
``WorkerBusy`` (it answered but cannot serve now: try another member, keep this one) and
``WorkerLost`` (connection refused or cut, a 5xx, a garbled stream: drop it, re-run elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
from pydantic import ValidationError

from swarm.backends.base import Sampled, SamplingParams, TokenSink
from swarm.pool.wire import GENERATE_PATH, GenerateRequest, StreamLine, WireParams


class WorkerLost(RuntimeError):
    """The worker is gone or broken; what it produced so far is still valid."""


class WorkerBusy(RuntimeError):
    """The worker answered but cannot take this call now (loading weights, full, leaving)."""


class RemoteWorker:
    """Generation on a worker at ``address`` with the pool's worker token."""

    def __init__(self, address: str, token: str, *, member_id: str, timeout_s: float = 600.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.address = address.rstrip("/")
        self.member_id = member_id
        self._token = token
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
        self._owns_client = client is None

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        body = GenerateRequest(prompts=[list(p) for p in prompts], params=[WireParams.of(p) for p in params],
                               stream=True)
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with self._client.stream("POST", self.address + GENERATE_PATH, content=body.model_dump_json(),
                                           headers={**headers, "Content-Type": "application/json"}) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _refusal(response)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    done = self._line(line, sink)
                    if done is not None:
                        return done
        except httpx.TransportError as exc:  # refused, reset, cut mid-stream, timed out
            raise WorkerLost(f"worker {self.member_id} at {self.address}: {type(exc).__name__}: {exc}") from exc
        raise WorkerLost(f"worker {self.member_id} at {self.address} ended its stream without a result")

    def _line(self, line: str, sink: TokenSink | None) -> Sampled | None:
        try:
            item = StreamLine.model_validate(json.loads(line))
        except (ValueError, ValidationError) as exc:
            raise WorkerLost(f"worker {self.member_id} sent a garbled stream line: {exc}") from None
        if item.t is not None:
            if sink is not None:
                row, token, logprob, top = item.t
                sink(row, token, logprob, top)
            return None
        if item.error is not None:
            if item.status in (400, 422):
                raise ValueError(item.error)
            raise WorkerLost(f"worker {self.member_id} failed mid-generation: {item.error}")
        if item.done is not None:
            return item.done.sampled(source=self.member_id)
        return None

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _refusal(response: httpx.Response) -> Exception:
    """The error for a non-200 answer, by what the pool should do about it."""
    try:
        message = str(response.json().get("error", {}).get("message") or response.text)
    except ValueError:
        message = response.text
    message = message[:500]
    if response.status_code in (400, 422):
        return ValueError(message)
    if response.status_code in (409, 429, 503):
        return WorkerBusy(message)
    return WorkerLost(f"HTTP {response.status_code}: {message}")
