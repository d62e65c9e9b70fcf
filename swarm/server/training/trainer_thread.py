"""Where the trainer's blocking calls run: ``TrainerCalls``, and ``TrainerThread`` for a trainer that
does not share the device thread (verl's Ray workers).

Why: the trainer's methods block, so the server runs them off the event loop, one at a time and in the
order they were made (update, export, save). The in-process torch model runs them on its device thread
(``swarm.local.device_worker.DeviceWorker.call``), between generation batches; any other trainer gets
its own thread here, so generation on the device thread goes on while it trains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

__all__ = ["TrainerCalls", "TrainerThread"]

T = TypeVar("T")


class TrainerCalls(Protocol):
    """Runs a blocking trainer call off the event loop, after those queued before it."""

    async def call(self, fn: Callable[[], T]) -> T: ...


class TrainerThread:
    """One thread for a trainer that does not share the device thread (its calls stay ordered)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarm-trainer")

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def stop(self) -> None:
        self._pool.shutdown(wait=True)
