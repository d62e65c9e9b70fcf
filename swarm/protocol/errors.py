"""The one error shape every route answers with (``ErrorBody``).
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel

__all__ = ["ErrorBody", "ErrorCode", "ErrorInfo"]

class ErrorCode(str, Enum):
    bad_request = "bad_request"
    unauthorized = "unauthorized"
    forbidden = "forbidden"
    not_found = "not_found"
    conflict = "conflict"
    gone = "gone"
    payload_too_large = "payload_too_large"
    context_length_exceeded = "context_length_exceeded"
    retry_later = "retry_later"
    disk_full = "disk_full"  # 507: the disk under the server's state dir is full; nothing was stored, retry later
    internal = "internal"


class ErrorInfo(BaseModel):
    code: ErrorCode
    message: str
    detail: Any = None
    retry_after: float | None = None


class ErrorBody(BaseModel):
    """The one error shape of every route: ``{"error": {"code", "message", "detail"}}``."""

    error: ErrorInfo
