"""One error shape for every route: ``{"error": {"code", "message", "detail", "retry_after"}}``.

ServerCore and route code raise ``ApiError`` (or a subclass naming the HTTP status); the handlers here map
it, FastAPI's validation errors, Starlette's HTTP errors (unknown route, wrong method) and malformed
JSON bodies onto ``protocol.ErrorBody``. Anything else is a bug: a 500 with code ``internal`` and a
logged traceback. ``BodyLimitMiddleware`` rejects oversize bodies before any route parses them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swarm.protocol import MAX_BODY_BYTES, ErrorBody, ErrorCode, ErrorInfo

log = logging.getLogger(__name__)

OPENAI_PREFIX = "/v1/"  # the OpenAI-compatible routes: every invalid request is a 400, as OpenAI answers


class ApiError(Exception):
    """A user-facing error with an HTTP status and a protocol error code."""

    status = 400
    code = ErrorCode.bad_request

    def __init__(self, message: str, *, detail: Any = None, retry_after: float | None = None,
                 status: int | None = None, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.retry_after = retry_after
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class BadRequest(ApiError):
    status, code = 400, ErrorCode.bad_request


class Unauthorized(ApiError):
    status, code = 401, ErrorCode.unauthorized


class Forbidden(ApiError):
    status, code = 403, ErrorCode.forbidden


class NotFound(ApiError):
    status, code = 404, ErrorCode.not_found


class Conflict(ApiError):
    status, code = 409, ErrorCode.conflict


class Gone(ApiError):
    status, code = 410, ErrorCode.gone


class RetryLater(ApiError):
    """Too many requests: come back after ``retry_after`` seconds (sent as ``Retry-After``)."""

    status, code = 429, ErrorCode.retry_later


class Unavailable(ApiError):
    """A part of the server (the generator's engine) is down for a while; retry after ``retry_after``."""

    status, code = 503, ErrorCode.retry_later


class InsufficientStorage(ApiError):
    """507: the disk under the state dir is full. Nothing was stored (the commit rolled back) and nothing
    was acknowledged, so the same request may be sent again after ``retry_after``."""

    status, code = 507, ErrorCode.disk_full


class ContextTooLong(ApiError):
    status, code = 400, ErrorCode.context_length_exceeded


_STATUS_CODES = {
    400: ErrorCode.bad_request,
    401: ErrorCode.unauthorized,
    403: ErrorCode.forbidden,
    404: ErrorCode.not_found,
    405: ErrorCode.bad_request,
    409: ErrorCode.conflict,
    410: ErrorCode.gone,
    413: ErrorCode.payload_too_large,
    429: ErrorCode.retry_later,
}


# Declared on every route so /openapi.json documents the one error shape each 4xx really has.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in (
        (400, "bad request"), (401, "missing or invalid token"), (403, "token does not open this"),
        (404, "no such episode or route"), (409, "conflicting state"), (410, "episode expired"),
        (413, "request body too large"), (422, "request failed validation"),
        (429, "retry later after Retry-After (paused, throttled, a weight update pending, work that could not "
              "train within max_staleness, or a bound on in-flight calls per key, queued generation rows or "
              "event streams reached)"),
        (500, "internal server error"),
        (507, "the disk under the state dir is full: nothing was stored; send the same request again after "
              "Retry-After (finishes, claims, checkpoints)"))
}


def error_response(status: int, code: ErrorCode, message: str, *, detail: Any = None,
                   retry_after: float | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorInfo(code=code, message=message, detail=detail, retry_after=retry_after))
    headers = None
    if retry_after is not None:  # whole seconds (HTTP), and milliseconds as the OpenAI SDKs read them first
        headers = {"Retry-After": str(max(1, round(retry_after))),
                   "retry-after-ms": str(max(1, round(retry_after * 1000)))}
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _validation_detail(exc: RequestValidationError) -> list[dict[str, Any]]:
    # The raw errors can hold non-JSON values (bytes, exceptions in ctx); keep the useful keys.
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()]


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, detail=exc.detail, retry_after=exc.retry_after)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """400 for malformed JSON, an unknown field and a refused option (naming it); any other invalid value
    is a 400 naming its field on the OpenAI routes (as OpenAI and vLLM answer, so SDKs raise their
    ``BadRequestError``) and a 422 on the control API."""
    assert isinstance(exc, RequestValidationError)
    detail = _validation_detail(exc)
    if any(d["type"] == "json_invalid" for d in detail):
        return error_response(400, ErrorCode.bad_request, "request body is not valid JSON", detail=detail)
    unknown = [".".join(str(p) for p in d["loc"] if p != "body") for d in detail if d["type"] == "extra_forbidden"]
    if unknown:  # OpenAI's answer to an option it does not know: 400, naming it
        return error_response(400, ErrorCode.bad_request,
                              f"unrecognized request argument supplied: {', '.join(unknown)}", detail=detail)
    refusals = [d for d in detail if d["type"] == "refused"]  # an option this server will not serve
    first = (refusals or detail or [{"loc": [], "msg": "invalid request"}])[0]
    where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
    if refusals:  # a model-level refusal names its field in its message
        named = first["msg"] if where == "body" else f"{where}: {first['msg']}"
        return error_response(400, ErrorCode.bad_request, f"unsupported request argument: {named}", detail=detail)
    status = 400 if request.url.path.startswith(OPENAI_PREFIX) else 422
    message = str(first["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return error_response(status, ErrorCode.bad_request, f"invalid request: {where}: {message}",
                          detail=detail)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, ErrorCode.bad_request if exc.status_code < 500 else ErrorCode.internal)
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and message == "Not Found":
        message = _no_such_route(request)
    elif exc.status_code == 405:
        message = "method not allowed on this route"
    return error_response(exc.status_code, code, message)


def _no_such_route(request: Request) -> str:
    """A 404 that names the OpenAI routes this server has, so a client pointed at the wrong one (legacy
    completions, a provider's own path) learns where to go."""
    paths = request.app.openapi().get("paths", {})  # the app's own route table (built once, cached)
    served = sorted(f"{method.upper()} {path}" for path, operations in paths.items() if path.startswith("/v1/")
                    for method in operations)
    hint = ""
    if request.url.path.rstrip("/").endswith("/v1/completions"):
        hint = " (legacy text completions are not served: send the prompt as a user message)"
    return (f"no such route: {request.method} {request.url.path}{hint}; the OpenAI routes here are "
            f"{', '.join(served)}, and the control API is under /api/v1 (GET /openapi.json lists every route)")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, ErrorCode.internal, "internal server error", detail=type(exc).__name__)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


class BodyLimitMiddleware:
    """Reject bodies over ``limit`` bytes with 413: by Content-Length up front, or while streaming."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._reject(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, ErrorCode.payload_too_large,
                                  f"request body exceeds {self.limit} bytes")
        await response(scope, receive, send)


class _TooLarge(StarletteHTTPException):
    """Raised from ``receive``; an HTTPException so FastAPI's body parsing re-raises it unchanged."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")


def dumps_error(code: ErrorCode, message: str) -> str:
    """An error body as JSON text, for errors that happen inside an SSE stream."""
    return json.dumps(ErrorBody(error=ErrorInfo(code=code, message=message)).model_dump(mode="json"))
