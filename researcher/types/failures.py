"""The failures every layer of the researcher tells apart, and the two signals that stop a study.

- ``ParkStudy``: what a collaborator raises when the study must wait for the next window (the
  planner's ``QuotaExhausted`` is one) -> the graph parks instead of failing.
- ``FailStudy``: what a collaborator raises when the study cannot go on and no retry can help (the
  planner's ``StepFailed``: the LLM failed a step the offline planner cannot take either) -> the graph
  fails the study with its message, and the report follows.
- ``is_disk_full``: a write failed for want of space (ENOSPC, a quota, SQLite's "disk is full") -> the
  graph parks the study with a ``disk_full`` event instead of failing the node
  (``researcher.session.graph``); the session and the daemon end parked, not with a traceback.
- ``is_quota_error``: the LLM provider says the account is out of quota or credit (an openai
  ``RateLimitError`` with ``insufficient_quota``, 402 Payment Required, a 403 about billing) -> park
  and wait for the next window; unlike a plain 429, retrying soon cannot help.
- ``is_transient``: an LLM error that a later try may get past (connection, timeout, rate limit,
  5xx) -> the LLM planner retries the request while the study's deadline leaves time (then the
  offline planner takes the step); the graph's retry policy uses it too.

Standard library only (openai is imported inside the two LLM checks, which only an LLM's errors reach),
so the planner, the nodes, the session and the daemon all classify by the same rules.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Mapping
from typing import Any

_QUOTA_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "quota_exceeded",
                "credit_balance_too_low", "payment_required"}
_BILLING_WORDS = ("quota", "billing", "credit", "payment")
# SQLite's "database or disk is full", and a WAL database's shared-memory file it could not extend
# (what a reader or writer of graph.db meets on a full tmpfs: "disk I/O error").
_SQLITE_FULL = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_SHMSIZE)


class ParkStudy(RuntimeError):
    """The study cannot go on in this window (e.g. the LLM account is out of credit): park it."""


class FailStudy(RuntimeError):
    """The study cannot go on and no retry can help: the graph ends it ``failed`` with this message."""

    def failed_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """What the failing node returns instead of its result (a subclass adds what the node spent)."""
        return {"phase": "failed", "error": str(self)}


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is a write the disk refused for want of space."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain, bounded
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(seen, sqlite3.Error) and getattr(seen, "sqlite_errorcode", None) in _SQLITE_FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_quota_error(exc: BaseException) -> bool:
    """True for an LLM API error that means 'out of quota/credit', not 'slow down'."""
    import openai

    if not isinstance(exc, openai.APIStatusError):
        return False
    code = str(getattr(exc, "code", None) or "").lower()
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
    kinds = {code, str(error.get("code") or "").lower(), str(error.get("type") or "").lower()}
    if kinds & _QUOTA_CODES:
        return True
    if exc.status_code == 402:
        return True
    text = str(exc).lower()
    return exc.status_code in (403, 429) and any(word in text for word in _BILLING_WORDS) and "rate" not in code


def is_transient(exc: BaseException) -> bool:
    """Connection problems, timeouts, rate limits and server errors; never a 4xx the caller caused,
    and never an exhausted quota (retrying cannot help: the study parks instead)."""
    import openai

    if is_quota_error(exc):
        return False
    if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError)):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500
