"""The client's exception tree, mapped once at the HTTP boundary from ``protocol.ErrorBody``.

``SwarmError`` is the root. ``SwarmHTTPError`` is a definite answer from the server (a 4xx, or a
5xx that kept happening) carrying the protocol error code; ``SwarmUnavailable`` means the server
could not be reached (or kept failing) for the whole retry window.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import ValidationError

from swarm.protocol import ErrorBody


class SwarmError(Exception):
    """Base class of every error the swarm client raises."""


class SwarmHTTPError(SwarmError):
    """The server answered with an error: ``status`` (HTTP), ``code`` (protocol ``ErrorCode`` value)."""

    def __init__(self, status: int, code: str, message: str, *, detail: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.retry_after = retry_after


class SwarmUnavailable(SwarmError):
    """The server was unreachable (or kept answering 5xx) for the whole retry window, or the client is stopping."""


def http_error_from(response: httpx.Response) -> SwarmHTTPError:
    """Parse the server's one error shape; a non-conforming body still gives a useful error."""
    try:
        info = ErrorBody.model_validate_json(response.content).error
    except ValidationError:
        text = response.text.strip()[:500] or response.reason_phrase
        return SwarmHTTPError(response.status_code, "unknown", text)
    return SwarmHTTPError(response.status_code, info.code.value, info.message, detail=info.detail,
                          retry_after=info.retry_after)
