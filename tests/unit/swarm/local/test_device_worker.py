"""The device thread (``swarm.local.device_worker``) on the real tiny model: a request past the queue's
bound is refused at once while the admitted ones are answered, and other work runs on the one device
thread, in order, its error handed back to the caller."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from swarm.backends.base import QueueFull, SamplingParams, TrainConfig
from swarm.local.device_worker import DeviceWorker


@pytest.fixture
def worker(tiny_dir: Path):
    from swarm.backends.torch import TorchBackend

    backend = TorchBackend.from_model(str(tiny_dir), TrainConfig(), seed=0)
    worker = DeviceWorker(backend, window_s=0.001, max_rows=1, max_queued_rows=1)
    worker.start()
    yield worker
    worker.stop()


def test_a_request_past_the_queue_bound_is_refused_at_once_and_the_admitted_are_answered(worker) -> None:
    params = SamplingParams(max_tokens=4, seed=0)

    async def scenario() -> list[int]:
        running = worker.submit([[97, 98, 99]], [params])
        waiting = worker.submit([[100, 101]], [params])  # one row runs, one waits: the bound is 1 + 1
        with pytest.raises(QueueFull) as refused:
            worker.submit([[102]], [params])
        assert refused.value.retry_after > 0 and worker.outstanding_rows == 2
        answers = await asyncio.gather(running, waiting)
        return [len(answer.generations) for answer in answers]

    assert asyncio.run(scenario()) == [1, 1]
    assert worker.outstanding_rows == 0 and worker.stats.rows == 2


def test_other_work_runs_on_the_device_thread_in_order_and_its_error_reaches_the_caller(worker) -> None:
    order: list[str] = []

    def job(name: str) -> str:
        order.append(name)
        return threading.current_thread().name

    def fails() -> None:
        raise ValueError("the checkpoint could not be written")

    async def scenario() -> list[str]:
        names = await asyncio.gather(worker.call(lambda: job("first")), worker.call(lambda: job("second")))
        with pytest.raises(ValueError, match="could not be written"):
            await worker.call(fails)
        return names

    assert asyncio.run(scenario()) == ["swarm-device", "swarm-device"] and order == ["first", "second"]
