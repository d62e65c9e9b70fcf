"""A loopback load generator: N concurrent clients doing claim → chat (openai SDK) → finish loops.

Used by the in-suite load test (small) and ``tests/bench/bench_load.py`` (200 clients). All clients
run as asyncio tasks in one process (200 client processes would not fit a small machine), each with
its own episode key, over one shared connection pool per protocol. A request *fails* when it gets a
5xx, a transport error, or any 4xx other than a 429 "retry later" (which the client honours, as
``SwarmClient`` does): with well-behaved clients, none of those is the clients' fault.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import openai


@dataclass
class LoadResult:
    requests: int = 0
    failed: int = 0
    retried_429: int = 0
    episodes: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_load(url: str, token: str, *, clients: int, seconds: float, group_size: int = 4,
                   on_tick: Callable[[float], None] | None = None) -> LoadResult:
    """Run ``clients`` concurrent episode loops for ``seconds``; ``on_tick(elapsed)`` once a second."""
    result = LoadResult()
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as http, \
            openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120,
                               http_client=httpx.AsyncClient(limits=limits, timeout=120)) as llm:

        async def timed(kind: str, call) -> object | None:  # a coroutine factory
            while True:
                started = time.perf_counter()
                result.requests += 1
                try:
                    response = await call()
                except openai.RateLimitError:
                    result.retried_429 += 1
                    await asyncio.sleep(0.2)
                    continue
                except (httpx.HTTPError, openai.APIError) as exc:
                    result.failed += 1
                    result.errors[f"{kind}: {type(exc).__name__}: {str(exc)[:120]}"] += 1
                    return None
                result.latencies.append(time.perf_counter() - started)
                if isinstance(response, httpx.Response):
                    if response.status_code == 429:
                        result.retried_429 += 1
                        await asyncio.sleep(float(response.json()["error"].get("retry_after") or 0.2))
                        continue
                    if response.status_code != 200:
                        result.failed += 1
                        result.errors[f"{kind}: {response.status_code} {response.text[:160]}"] += 1
                        return None
                return response

        async def one_client(i: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                group = f"c{i}-g{n // group_size}"
                n += 1
                claim = await timed("claim", lambda: http.post("/api/v1/episodes", json={
                    "task_id": f"task-{i % 16}", "group_id": group, "group_size": group_size, "client_id": f"c{i}"}))
                if claim is None:
                    continue
                episode = claim.json()
                chat = await timed("chat", lambda: llm.with_options(api_key=episode["api_key"]).chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"say a {n}"}], max_tokens=8))
                if chat is None:
                    continue
                text = chat.choices[0].message.content or ""
                finished = await timed("finish", lambda: http.post(
                    f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": text.count("a") / 8.0},
                    headers={"Authorization": f"Bearer {episode['api_key']}"}))
                if finished is not None:
                    result.episodes += 1

        async def ticker() -> None:
            started = time.monotonic()
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                if on_tick is not None:
                    on_tick(time.monotonic() - started)

        await asyncio.gather(ticker(), *(one_client(i) for i in range(clients)))
    return result
