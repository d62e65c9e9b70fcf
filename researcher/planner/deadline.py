"""How long an LLM call may take: the study's deadline, cut into attempts, retries and their waits.

A study ends at its deadline whatever its LLM is doing. ``LLMDeadline`` says when each planner step's
calls must be done: every step where the report reserve begins (the deadline minus the reserve, where
the graph's own work stops), the report's wording by the middle of the reserve (its second half
renders and writes the report). The session sets it from the study's budget when it starts or resumes
the study; a planner used outside a study has none, and its calls are bounded by their timeout only.

``call_within`` makes one request with retries so that all of it fits before that time: each attempt's
timeout is the configured one cut to the time left, a failure worth retrying waits its backoff only
when an attempt still fits after it, and no attempt starts with less than ``MIN_ATTEMPT_S`` left
(``OutOfTime``). The SDK's own retries are off (its backoff honours a Retry-After of up to 60 s and
knows no deadline). ``within_seconds`` enforces an attempt's limit whatever the HTTP client is doing:
socket timeouts bound each read, not a whole call (a server that trickles bytes, a slow DNS lookup).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from researcher.planner.schema import OutOfTime

log = logging.getLogger(__name__)
__all__ = ["MIN_ATTEMPT_S", "REPORT_STEP", "LLMDeadline", "attempt_timeout", "backoff", "call_within",
           "within_seconds"]
R = TypeVar("R")

MIN_ATTEMPT_S = 2.0      # no LLM answers a planner prompt faster: an attempt with less time left is not made
BACKOFF_S = 0.5          # the first retry's wait, doubled for each further retry (the SDK's schedule) ...
BACKOFF_MAX_S = 8.0      # ... up to this
REPORT_STEP = "write_report"  # the LLM planner's name for the report step, which may use half the reserve


class LLMDeadline:
    """When the planner's LLM calls must be done, from the study's deadline and report reserve (``set``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.deadline: float | None = None   # the study's end, epoch seconds; None: no study deadline known
        self.report_reserve_s = 0.0

    def set(self, deadline: float, report_reserve_s: float) -> None:
        self.deadline, self.report_reserve_s = deadline, report_reserve_s

    def until(self, step: str) -> float | None:
        """The time (epoch seconds) by which ``step``'s calls must have ended; None without a deadline."""
        if self.deadline is None:
            return None
        return self.deadline - (self.report_reserve_s / 2 if step == REPORT_STEP else self.report_reserve_s)

    def left(self, step: str) -> float | None:
        """Seconds left for ``step``'s calls (negative once past); None without a deadline."""
        until = self.until(step)
        return None if until is None else until - self.clock()


def attempt_timeout(left_s: float | None, timeout_s: float) -> float | None:
    """The next attempt's limit: the configured timeout cut to the time left; None when too little is left."""
    if left_s is None:
        return timeout_s
    if left_s < MIN_ATTEMPT_S:
        return None
    return min(timeout_s, left_s)


def backoff(failures: int) -> float:
    """The wait before retry number ``failures`` (1, 2, ...): 0.5 s doubling, at most 8 s."""
    return min(BACKOFF_S * 2 ** (failures - 1), BACKOFF_MAX_S)


def call_within(send: Callable[[float], R], *, left: Callable[[], float | None], timeout_s: float,
                max_retries: int, wait: Callable[[Exception, int], float | None],
                sleep: Callable[[float], None] = time.sleep) -> R:
    """``send(limit)``, retried, all of it within the time ``left()`` gives (None: no deadline).

    ``send`` must return or raise within ``limit`` seconds. A failure is retried at most ``max_retries``
    times, after ``wait(failure, failures)`` seconds (None: not worth retrying, re-raised), and only when
    an attempt still fits after the wait; otherwise the failure is re-raised. ``OutOfTime`` when no
    attempt fits at all."""
    failures = 0
    while True:
        remaining = left()
        limit = attempt_timeout(remaining, timeout_s)
        if limit is None:
            raise OutOfTime(f"no time left for an LLM call: {remaining:.1f} s before the planner's deadline "
                            f"(an attempt needs at least {MIN_ATTEMPT_S:g} s)")
        try:
            return send(limit)
        except Exception as exc:
            pause = wait(exc, failures + 1) if failures < max_retries else None
            remaining = left()
            if pause is None or (remaining is not None and remaining - pause < MIN_ATTEMPT_S):
                raise
            failures += 1
            log.info("LLM call failed (%s: %s); retry %d of %d in %.1f s", type(exc).__name__, exc, failures,
                     max_retries, pause)
            sleep(pause)


def within_seconds(seconds: float, fn: Callable[[], R], why: str = "") -> R:
    """``fn()``, or ``TimeoutError`` (its message ending in ``why``) once ``seconds`` have passed, whatever
    ``fn`` is doing.

    ``fn`` runs on a daemon thread; one that overruns is left to end on its own (its socket timeouts
    end it soon after) and its result is dropped, so it neither blocks the study nor the process exit."""
    outcome: list[R] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # handed to the caller below
            failure.append(exc)

    thread = threading.Thread(target=target, name="llm-call", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:.1f} s{why}")
    if failure:
        raise failure[0]
    return outcome[0]
