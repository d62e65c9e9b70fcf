"""One thread for a trainer that does not share the device thread (verl's Ray workers).

Why: generation on the device thread goes on while such a trainer trains, and one worker thread keeps
the trainer's calls in the order they were made (update, export, save).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["TrainerThread"]

T = TypeVar("T")


class TrainerThread:
    """One thread for a trainer that does not share the device thread (its calls stay ordered)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarm-trainer")

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def stop(self) -> None:
        self._pool.shutdown(wait=True)
