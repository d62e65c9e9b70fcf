"""The device thread: the one place the model is touched, and the batcher that feeds it.

The model is not thread-safe and a CPU has few cores, so every backend call that runs the model
(generate, train, supervised steps, save) goes through one worker thread. Generation is
continuous: chat requests arriving within ``window_s`` of each other start one
``backend.generate`` call, requests arriving while it runs join it at the next decode step (up to
``max_rows`` rows at once), and each request is answered the moment its own rows finish. That is
what lets many single-request clients, which trickle in rather than arrive at once, approach
offline batched throughput. Other jobs (a training step, a checkpoint) stop admissions, wait for
the running rows to drain and then run, in arrival order.

Results come back to the asyncio loop through futures; streamed tokens are pushed with
``loop.call_soon_threadsafe`` so route code never blocks the event loop.

Bounds: at most ``max_rows`` rows run and ``max_queued_rows`` more wait; ``submit`` beyond that
raises the generator contract's ``QueueFull`` (``swarm.backends.base``) at once (the chat route answers
429) instead of letting the queue grow without end. A request whose future is cancelled (its client
went away) is dropped from the queue, and its running rows stop at the next decode step
(``_JobFeed.cancelled``), freeing their slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from swarm.backends.base import (
    Generation,
    QueueFull,
    RowFeed,
    Sampled,
    Sampler,
    SamplingParams,
    TokenSink,
    TopAlternatives,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _GenJob:
    prompts: list[list[int]]
    params: list[SamplingParams]
    future: asyncio.Future[Sampled]
    loop: asyncio.AbstractEventLoop
    sink: TokenSink | None = None


@dataclass
class _CallJob:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


_STOP = object()
# A steady stream of arrivals may hold a batch open for at most this many windows.
_MAX_WINDOWS = 32


@dataclass
class WorkerStats:
    """Counters for ``/api/v1/status``: ``batches`` counts ``backend.generate`` calls (a continuous
    call serves every row admitted while it runs), ``rows`` the rows admitted into them, ``cancelled``
    the rows dropped from the queue or stopped mid-generation because their request was cancelled."""

    batches: int = 0
    rows: int = 0
    generate_s: float = 0.0
    tokens: int = 0
    cancelled: int = 0


class DeviceWorker:
    """Runs backend work on one thread; ``generate`` requests are batched across callers."""

    def __init__(self, backend: Sampler, *, window_s: float, max_rows: int, max_queued_rows: int = 256) -> None:
        self.backend = backend
        self.window_s = window_s
        self.max_rows = max_rows
        self.max_queued_rows = max_queued_rows
        self.stats = WorkerStats()
        self.outstanding_rows = 0  # submitted and not yet answered; changed on the event loop only
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="swarm-device", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def set_window(self, window_s: float, max_rows: int, max_queued_rows: int | None = None) -> None:
        """Live config changes; read by the worker at the next batch (and the next ``submit``)."""
        self.window_s = window_s
        self.max_rows = max_rows
        if max_queued_rows is not None:
            self.max_queued_rows = max_queued_rows

    def submit(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
               sink: TokenSink | None = None) -> asyncio.Future[Sampled]:
        """Queue a generation request now (from the event loop); the future resolves with its rows.
        ``QueueFull`` when the rows running and waiting would pass ``max_rows + max_queued_rows``
        (a request alone may be larger: it runs once nothing else does). Cancel the future to
        withdraw the request; its rows stop at the next decode step."""
        rows = len(prompts)
        limit = self.max_rows + self.max_queued_rows
        if self.outstanding_rows and self.outstanding_rows + rows > limit:
            raise QueueFull(f"the generation queue is full ({self.outstanding_rows} rows running or waiting, "
                            f"at most {limit})", retry_after=2.0)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sampled] = loop.create_future()
        self.outstanding_rows += rows
        future.add_done_callback(lambda _: self._answered(rows))
        self._queue.put(_GenJob([list(p) for p in prompts], list(params), future, loop, sink))
        return future

    def _answered(self, rows: int) -> None:
        self.outstanding_rows -= rows

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the device thread (once the running generation drained) and await its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_CallJob(fn, future, loop))
        return await future

    # ------------------------------------------------------------------ worker thread

    def _run(self) -> None:
        held: list[Any] = []  # jobs taken off the queue while collecting a batch
        while True:
            job = held.pop(0) if held else self._queue.get()
            if job is _STOP:
                return
            if isinstance(job, _CallJob):
                self._run_call(job)
                continue
            if self._withdrawn(job):
                continue
            self._run_generation(self._collect(job, held), held)

    def _withdrawn(self, job: _GenJob) -> bool:
        """A queued request whose caller went away: dropped before it costs a forward pass."""
        if not job.future.done():
            return False
        self.stats.cancelled += len(job.prompts)
        return True

    def _collect(self, first: _GenJob, held: list[Any]) -> list[_GenJob]:
        """Gather requests arriving within the window of each other (a burst keeps the window open,
        up to ``_MAX_WINDOWS`` windows), so a burst of clients becomes one forward pass."""
        batch = [first]
        rows = len(first.prompts)
        now = time.monotonic()
        deadline, hard_deadline = now + self.window_s, now + self.window_s * _MAX_WINDOWS
        while rows < self.max_rows and not held:
            timeout = min(deadline, hard_deadline) - time.monotonic()
            try:
                nxt = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(nxt, _GenJob) and self._withdrawn(nxt):
                continue
            if isinstance(nxt, _GenJob) and rows + len(nxt.prompts) <= self.max_rows:
                batch.append(nxt)
                rows += len(nxt.prompts)
                deadline = time.monotonic() + self.window_s
            else:
                held.append(nxt)  # a call job or an overflow row: runs next, in order
        log.debug("batch of %d rows from %d requests, collected in %.1f ms",
                  rows, len(batch), (time.monotonic() - now) * 1000)
        return batch

    def _run_call(self, job: _CallJob) -> None:
        try:
            result = job.fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            _resolve(job.loop, job.future, error=exc)
        else:
            _resolve(job.loop, job.future, result=result)

    def _run_generation(self, jobs: list[_GenJob], held: list[Any]) -> None:
        feed = _JobFeed(self, jobs, held)
        started = time.perf_counter()
        try:
            self.backend.generate([], [], feed.on_token, feed=feed)
        except BaseException as exc:  # every request still waiting gets the error
            log.exception("generation failed with %d rows running", feed.running)
            feed.fail(exc)
        self.stats.batches += 1
        self.stats.generate_s += time.perf_counter() - started


class _JobFeed(RowFeed):
    """The worker's ``RowFeed``: admits queued chat requests into the running generation.

    New requests join at the next decode step while the batch has room (``max_rows``). Once a call
    job (a training step, a checkpoint) or a stop is waiting, nothing new is admitted, so the
    generation drains and that job runs next: training is never starved by a stream of chats. A
    request resolves as soon as its last row finishes; a cancelled (or already failed) request's
    rows stop at the next decode step and are not admitted at all if still waiting.
    """

    def __init__(self, worker: DeviceWorker, first: list[_GenJob], held: list[Any]) -> None:
        self.worker = worker
        self.held = held
        self.pending = list(first)  # collected before the generation started
        self.owners: list[tuple[_GenJob, int]] = []  # row index -> (request, its choice index)
        self.results: dict[int, list[Generation | None]] = {}  # id(request) -> its rows
        self.running = 0
        self.version = worker.backend.policy_version  # no update runs while a generation does
        self.closed = False

    def admit(self) -> list[tuple[list[int], SamplingParams]]:
        jobs, self.pending = self.pending, []
        if not self.closed:
            jobs += self._take_queued(len(jobs))
        jobs = [job for job in jobs if not self.worker._withdrawn(job)]
        rows: list[tuple[list[int], SamplingParams]] = []
        for job in jobs:
            self.results[id(job)] = [None] * len(job.prompts)
            for i, (prompt, param) in enumerate(zip(job.prompts, job.params, strict=True)):
                self.owners.append((job, i))
                rows.append((prompt, param))
        self.running += len(rows)
        self.worker.stats.rows += len(rows)
        if rows:
            log.debug("%d rows join (%d running)", len(rows), self.running)
        return rows

    def _take_queued(self, rows_taken: int) -> list[_GenJob]:
        """Queued requests that fit now, in arrival order; stops at the first that must wait."""
        taken: list[_GenJob] = []
        room = self.worker.max_rows - self.running - rows_taken
        while True:
            if self.held:
                job = self.held[0]
                if isinstance(job, _GenJob) and self.worker._withdrawn(job):
                    self.held.pop(0)
                    continue
                if isinstance(job, _GenJob) and len(job.prompts) <= room:
                    taken.append(self.held.pop(0))
                    room -= len(job.prompts)
                    continue
                if not isinstance(job, _GenJob):  # a call job or a stop: drain so it runs next
                    self.closed = True
                return taken  # a request too big for the room left waits for rows to finish
            try:
                self.held.append(self.worker._queue.get_nowait())
            except queue.Empty:
                return taken

    def cancelled(self, row: int) -> bool:
        """Whether row ``row``'s request was cancelled or already failed: its row can stop now."""
        owner, _ = self.owners[row]
        return owner.future.done()

    def on_token(self, row: int, token: int, logprob: float, top: TopAlternatives | None) -> None:
        owner, local = self.owners[row]
        if owner.sink is not None and not owner.future.done():
            owner.loop.call_soon_threadsafe(owner.sink, local, token, logprob, top)

    def finished(self, row: int, generation: Generation) -> None:
        self.running -= 1
        log.debug("row %d done (%d running)", row, self.running)
        self.worker.stats.tokens += len(generation.token_ids)
        owner, local = self.owners[row]
        rows = self.results.get(id(owner))
        if rows is None or owner.future.done():  # the request was cancelled or already failed
            self.worker.stats.cancelled += 1
            self.results.pop(id(owner), None)
            return
        rows[local] = generation
        if all(r is not None for r in rows):
            del self.results[id(owner)]
            _resolve(owner.loop, owner.future, result=Sampled([r for r in rows if r is not None], self.version))

    def rejected(self, row: int, error: ValueError) -> None:
        self.running -= 1
        owner, _ = self.owners[row]
        if self.results.pop(id(owner), None) is not None:
            _resolve(owner.loop, owner.future, error=error)

    def fail(self, error: BaseException) -> None:
        for job in self.pending:
            _resolve(job.loop, job.future, error=error)
        for owner, _ in self.owners:
            if self.results.pop(id(owner), None) is not None:
                _resolve(owner.loop, owner.future, error=error)


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], *,
             result: Any = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if future.done():  # the awaiting request was cancelled (client went away)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
        loop.call_soon_threadsafe(settle)
