"""A retrying JSON transport: the one place the client decides what is worth retrying.

Retried, with jittered exponential backoff, until ``retry_for_s`` has passed:
- connection failures (the request never reached a server: a restart, a crash, not up yet);
- 429, or 409 with ``retry_after`` (the throttler or a weight sync says "wait"), honouring the hint;
- 503 always, and other 5xx / broken connections mid-request only for idempotent calls, so a
  non-idempotent call (a supervised warm-up) is never run twice.
Every other 4xx is a definite answer and raises ``SwarmHTTPError`` at once. A token read from the
server's token file is re-read once on a 401, because a restarted server may have written a new one.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from swarm.client._errors import SwarmHTTPError, SwarmUnavailable, http_error_from

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 2.0


class Transport:
    """Sends JSON requests to one server with the control token and the retry policy above."""

    def __init__(self, url: str, *, token: str | None, token_file: Path | None, timeout: float,
                 retry_for_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retry_for_s = retry_for_s
        self._token_file = token_file if token is None else None
        self._token = token if token is not None else self._read_token_file()
        self._http = httpx.Client(base_url=self.url, timeout=timeout,
                                  limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    @property
    def token(self) -> str | None:
        return self._token

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, body: BaseModel | None = None,
                params: dict[str, Any] | None = None, bearer: str | None = None, idempotent: bool = True,
                retry_for_s: float | None = None, timeout: float | None = None) -> httpx.Response:
        """Send one request, retrying per the module policy; returns a 2xx response.

        ``bearer`` overrides the control token (episode routes authenticate with the episode key).
        """
        window = self.retry_for_s if retry_for_s is None else retry_for_s
        deadline = time.monotonic() + window
        content = body.model_dump_json(exclude_none=True) if body is not None else None
        attempt = 0
        reread_token = self._token_file is not None and bearer is None
        while True:
            attempt += 1
            headers = {"Content-Type": "application/json"} if content is not None else {}
            token = bearer if bearer is not None else self._token
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
                    fresh = self._read_token_file()
                    if fresh and fresh != self._token:
                        log.info("control token changed on disk; retrying with the new one")
                        self._token = fresh
                        continue
                if not _retryable(response.status_code, error, idempotent):
                    raise error
                problem, hint = error, error.retry_after
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SwarmUnavailable(f"{method} {self.url}{path}: still failing after {window:.0f} s "
                                       f"({attempt} attempts): {problem}") from problem
            delay = min(_MAX_BACKOFF_S, 0.05 * 2 ** min(attempt, 10)) * (0.5 + random.random() / 2)
            if hint is not None:
                delay = max(delay, min(hint, _MAX_BACKOFF_S * 5))
            # "Come back later" is normal flow control; an unreachable server is worth a line once.
            quiet = hint is not None or attempt > 1
            (log.debug if quiet else log.info)("%s %s failed (%s); retrying in %.2f s", method, path, problem, delay)
            time.sleep(min(delay, remaining))

    @contextmanager
    def stream(self, path: str, *, headers: dict[str, str] | None = None) -> Iterator[httpx.Response]:
        """One streaming GET (no retries here: the caller resumes); raises on a non-2xx answer."""
        merged = dict(headers or {})
        if self._token:
            merged["Authorization"] = f"Bearer {self._token}"
        timeout = httpx.Timeout(self.timeout, read=None)  # a quiet stream is not an error
        with self._http.stream("GET", path, headers=merged, timeout=timeout) as response:
            if not response.is_success:
                response.read()
                raise http_error_from(response)
            yield response

    def _read_token_file(self) -> str | None:
        if self._token_file is None:
            return None
        try:
            return self._token_file.read_text().strip() or None
        except OSError:
            return None


def _retryable(status: int, error: SwarmHTTPError, idempotent: bool) -> bool:
    if status == 429 or (status == 409 and error.retry_after is not None):
        return True  # the server explicitly asked us to come back later: nothing was done
    if status == 503:
        return True
    return status >= 500 and idempotent
