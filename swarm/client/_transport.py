"""A retrying JSON transport: the one place the client decides what is worth retrying.

Retried until ``retry_for_s`` has passed without an answer worth waiting for, after a jittered
exponential backoff unless the server said when (``retry_after``). A "retry later" answer restarts
that clock: the server is up and pacing its clients, and its pacing may outlast any fixed window
(admission holds new groups until a step commits, minutes for a real model on a CPU; a client that
gave up after 30 s of refusals stopped a healthy run). The window bounds an unreachable or failing
server, never a live one's flow control. Retried:
- connection failures (the request never reached a server: a restart, a crash, not up yet);
- 429, or 409 with ``retry_after`` (the throttler, admission or a weight sync says "wait"), after
  the hint itself (jittered a little, so a crowd of refused calls does not return in one burst):
  the server knows when room frees (admission: when the next step commits), and a backoff that
  grows with every refusal would leave a member of a group far behind the rest of its group;
- 507 (the server's disk is full: it stored nothing, so the same call is safe to send again), after
  its hint, for as long as the server keeps answering it: a finish is kept, not given up, until the
  server has room to commit it, and a claim waits for room as it waits for a throttle;
- 503 always, and other 5xx / broken connections mid-request only for idempotent calls, so a
  non-idempotent call (a supervised warm-up) is never run twice.
Every other 4xx is a definite answer and raises ``SwarmHTTPError`` at once. After ``stop_retrying``
(a run that was interrupted) nothing is retried: a stopping process does not wait out a dead server.

Two credentials: the control token (config, control, SFT, events) and the client token (claims); a
request names which it wants (``as_client``) and falls back to the other when it is missing, so a
client holding only one of them gets the server's clear 403 rather than a silent 401. A token read
from a file (``<state-dir>/token``, ``<state-dir>/client_token``) is re-read once on a 401, in case
the server's file was replaced by hand or the file only appeared after the client started.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from swarm.client._errors import SwarmHTTPError, SwarmUnavailable, http_error_from

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 2.0


class Credential:
    """A bearer token given outright, or read from a file (then re-readable with ``refresh``)."""

    def __init__(self, value: str | None, file: Path | None = None) -> None:
        self._file = file if value is None else None
        self.value = value if value is not None else self._read()

    @property
    def from_file(self) -> bool:
        return self._file is not None

    def refresh(self) -> bool:
        """Re-read the file; True when it now holds a different token."""
        fresh = self._read()
        if fresh is None or fresh == self.value:
            return False
        self.value = fresh
        return True

    def _read(self) -> str | None:
        if self._file is None:
            return None
        try:
            return self._file.read_text().strip() or None
        except OSError:
            return None


class Transport:
    """Sends JSON requests to one server with the right credential and the retry policy above."""

    def __init__(self, url: str, *, control: Credential, client: Credential, timeout: float,
                 retry_for_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for_s = retry_for_s
        self._control = control
        self._client = client
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        self._stopping = threading.Event()  # set: every call is tried once, no retry waits

    @property
    def token(self) -> str | None:
        """The control token, if this transport has one."""
        return self._control.value

    @property
    def client_token(self) -> str | None:
        """What claims are sent with: the client token, else the control token."""
        return self._bearer(as_client=True)

    def _bearer(self, *, as_client: bool) -> str | None:
        first, second = (self._client, self._control) if as_client else (self._control, self._client)
        return first.value or second.value

    def close(self) -> None:
        self._http.close()

    def stop_retrying(self) -> None:
        """From now on a failed call raises at once, and a retry wait in progress ends: a stopping
        process must not wait out an unreachable server (``retry_for_s``, minutes) before it exits."""
        self._stopping.set()

    def request(self, method: str, path: str, *, body: BaseModel | None = None,
                params: dict[str, Any] | None = None, bearer: str | None = None, as_client: bool = False,
                idempotent: bool = True, retry_for_s: float | None = None,
                timeout: float | None = None,
                while_refused: Callable[[SwarmHTTPError], None] | None = None) -> httpx.Response:
        """Send one request, retrying per the module policy; returns a 2xx response.

        Sent with the control token, or the client token when ``as_client`` (claims); ``bearer``
        overrides both (episode routes authenticate with the episode key). ``while_refused`` gets
        each "retry later" answer before its wait (the time it takes counts toward the wait).
        """
        window = self.retry_for_s if retry_for_s is None else retry_for_s
        deadline = time.monotonic() + window
        content = body.model_dump_json(exclude_none=True) if body is not None else None
        attempt = 0
        reread_token = bearer is None and (self._control.from_file or self._client.from_file)
        while True:
            attempt += 1
            headers = {"Content-Type": "application/json"} if content is not None else {}
            token = bearer if bearer is not None else self._bearer(as_client=as_client)
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = self._http.request(method, path, content=content, params=params, headers=headers,
                                              timeout=self.timeout if timeout is None else timeout)
            except httpx.TransportError as exc:
                delivered = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if delivered and not idempotent:
                    raise SwarmUnavailable(f"{method} {path}: connection lost mid-request ({exc!r}); "
                                           "not retried because the call is not idempotent") from exc
                problem: Exception = exc
                hint = None
            else:
                if response.is_success:
                    return response
                error = http_error_from(response)
                if response.status_code == 401 and reread_token:
                    reread_token = False
                    if self._control.refresh() | self._client.refresh():  # both files, once
                        log.info("token changed on disk; retrying with the new one")
                        continue
                if not _retryable(response.status_code, error, idempotent):
                    raise error
                problem, hint = error, error.retry_after
                if hint is not None and while_refused is not None:
                    began = time.monotonic()
                    while_refused(error)
                    hint = max(0.0, hint - (time.monotonic() - began))
                if hint is not None:  # a live server's "wait": the window starts again (module docstring),
                    deadline = time.monotonic() + window  # after the work the refusal asked for, however long
            self._back_off(method, path, window, deadline, attempt, problem, hint)

    def _back_off(self, method: str, path: str, window: float, deadline: float, attempt: int, problem: Exception,
                  hint: float | None) -> None:
        """Wait before the next attempt (the server's hint, else a jittered exponential backoff), or
        raise ``SwarmUnavailable`` when the window is spent or the client is stopping."""
        call, remaining = f"{method} {self.url}{path}", deadline - time.monotonic()
        if remaining <= 0 or self._stopping.is_set():
            when = "stopping, not retried" if self._stopping.is_set() else f"still failing after {window:.0f} s"
            raise SwarmUnavailable(f"{call}: {when} ({attempt} attempts): {problem}") from problem
        if hint is not None:
            delay = min(hint, _MAX_BACKOFF_S * 5) * (1 + random.random() / 4)
        else:
            delay = min(_MAX_BACKOFF_S, 0.05 * 2 ** min(attempt, 10)) * (0.5 + random.random() / 2)
        # "Come back later" is normal flow control; an unreachable server is worth a line once.
        quiet = hint is not None or attempt > 1
        (log.debug if quiet else log.info)("%s %s failed (%s); retrying in %.2f s", method, path, problem, delay)
        if self._stopping.wait(min(delay, remaining)):
            raise SwarmUnavailable(f"{call}: stopping, not retried ({attempt} attempts): {problem}") from problem

    @contextmanager
    def stream(self, path: str, *, headers: dict[str, str] | None = None) -> Iterator[httpx.Response]:
        """One streaming GET (no retries here: the caller resumes); raises on a non-2xx answer."""
        merged = dict(headers or {})
        token = self._bearer(as_client=False)
        if token:
            merged["Authorization"] = f"Bearer {token}"
        timeout = httpx.Timeout(self.timeout, read=None)  # a quiet stream is not an error
        with self._http.stream("GET", path, headers=merged, timeout=timeout) as response:
            if not response.is_success:
                response.read()
                raise http_error_from(response)
            yield response


def _retryable(status: int, error: SwarmHTTPError, idempotent: bool) -> bool:
    if status == 429 or (status == 409 and error.retry_after is not None):
        return True  # the server explicitly asked us to come back later: nothing was done
    if status in (503, 507):
        return True
    return status >= 500 and idempotent
