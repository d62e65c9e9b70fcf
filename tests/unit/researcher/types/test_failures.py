"""The failures every layer tells apart (``researcher.types.failures``), on the error shapes real providers
and SQLite raise; the filled-disk ENOSPC itself is ``e2e/researcher/test_watchdogs.py``'s."""

from __future__ import annotations

import errno
import sqlite3

from researcher.types import failures

QUOTA_BODY = {"error": {"message": "You exceeded your current quota, please check your plan and billing details.",
                        "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}


def test_quota_detection_on_error_shapes() -> None:
    import httpx
    import openai

    def error(status: int, body: dict) -> openai.APIStatusError:
        response = httpx.Response(status, json=body, request=httpx.Request("POST", "http://x/v1/chat/completions"))
        return openai.OpenAI(api_key="k", base_url="http://x/v1")._make_status_error_from_response(response)

    quota = error(429, QUOTA_BODY)
    slow_down = error(429, {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                      "code": "rate_limit_exceeded"}})
    billing = error(403, {"error": {"message": "Your credit balance is too low", "type": "invalid_request_error"}})
    payment = error(402, {"error": {"message": "Payment Required"}})
    assert failures.is_quota_error(quota) and not failures.is_transient(quota)
    assert not failures.is_quota_error(slow_down) and failures.is_transient(slow_down)
    assert failures.is_quota_error(billing) and failures.is_quota_error(payment)
    assert not failures.is_quota_error(error(400, {"error": {"message": "bad request"}}))


def test_a_failed_study_carries_its_message_and_a_full_disk_is_told_from_other_io_errors() -> None:
    assert failures.FailStudy("the LLM failed to plan").failed_state({"phase": "planning"}) == {
        "phase": "failed", "error": "the LLM failed to plan"}
    assert issubclass(failures.ParkStudy, RuntimeError) and not issubclass(failures.ParkStudy, failures.FailStudy)
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]  # as SQLite sets it
    wrapped = RuntimeError("checkpointing the graph failed")
    wrapped.__context__ = full
    assert failures.is_disk_full(wrapped) and failures.is_disk_full(OSError(errno.ENOSPC, "no space"))
    assert not failures.is_disk_full(OSError(errno.EIO, "I/O error"))
    assert not failures.is_disk_full(sqlite3.OperationalError("database is locked"))
