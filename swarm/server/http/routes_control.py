"""Status, metrics, live config and control routes under ``/api/v1``, plus ``GET /healthz``.

Everything here except ``/healthz`` needs the control token (an episode key is a 403); ``status``
also accepts the client token (read-only; a study's ``setup`` checks it). ``checkpoint``
answers with the checkpoint directory (``path``) and its loadable model folder (``weights``); if
writing it fails the answer is a 507 ``disk_full`` error for want of space (``swarm.server.durability.diskspace``),
else a 500 ``internal`` one, naming the cause; the failure is an ``error`` event (``where=checkpoint``)
and the status' ``last_error``, the previous checkpoint stays whole, and the server runs on.
``stop`` writes a checkpoint and then asks the hosting uvicorn server to exit through
``app.state.request_shutdown`` (set by ``serve``); see ``control`` for a stop whose checkpoint fails.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request

from swarm.protocol import (
    API_PREFIX,
    ConfigPatch,
    ConfigView,
    ControlAction,
    ControlResult,
    ErrorCode,
    ServerState,
    SftRequest,
    SftResult,
    Status,
    StepMetrics,
)
from swarm.server.auth import Principal, Role, require_client, require_control
from swarm.server.core import ServerCore
from swarm.server.durability.diskspace import RETRY_AFTER_S
from swarm.server.errors import ApiError, Forbidden, InsufficientStorage
from swarm.server.http.context import AppContext, app_context

log = logging.getLogger(__name__)

router = APIRouter()
_CONTROL = [Depends(require_control)]


@router.get("/healthz")
async def healthz(ctx: AppContext = Depends(app_context)) -> dict[str, object]:
    return {"ok": True, "state": ctx.core.state.value, "policy_version": ctx.core.policy_version}


@router.get(f"{API_PREFIX}/status", response_model=Status, dependencies=[Depends(require_client)])
async def status(request: Request, ctx: AppContext = Depends(app_context)) -> Status:
    return ctx.core.status()


@router.get(f"{API_PREFIX}/metrics", response_model=list[StepMetrics], dependencies=_CONTROL)
async def metrics(request: Request, since_step: int = Query(
                      0, ge=0, description="the steps after this one; 0: every row, with row 0 (the held-out "
                      "evaluation of the untrained policy) when there is one"),
                  ctx: AppContext = Depends(app_context)) -> list[StepMetrics]:
    """Per-step metrics; a held-out round adds ``eval/*`` to the row of the step it evaluated when it
    ends, which may be after that row was first read."""
    return ctx.core.metrics_since(since_step)


@router.get(f"{API_PREFIX}/config", response_model=ConfigView, dependencies=_CONTROL)
async def get_config(request: Request, ctx: AppContext = Depends(app_context)) -> ConfigView:
    return ctx.core.config_view()


@router.patch(f"{API_PREFIX}/config", response_model=ConfigView, dependencies=_CONTROL)
async def patch_config(body: ConfigPatch, request: Request, ctx: AppContext = Depends(app_context)) -> ConfigView:
    return ctx.core.patch_config(body.values)


def _may_warm_up(request: Request, principal: Principal = Depends(require_client)) -> Principal:
    """The control token may run a warm-up at any time. The client token may only warm up a fresh
    server (no step, no earlier warm-up): study code runs boxed with the client token, and its
    ``setup()`` teaches the answer format once; a client can already shape training through its
    rewards, so a one-time warm-up of an untrained policy gives it nothing more. A dependency, so the
    refusal comes before the body is read."""
    core = app_context(request).core
    if principal.role is Role.client and (core.step > 0 or core.policy_version > 0):
        raise Forbidden(f"the client token may only warm up a fresh server; this one is at step {core.step}, "
                        f"policy version {core.policy_version} (use the control token)")
    return principal


@router.post(f"{API_PREFIX}/control/sft", response_model=SftResult, dependencies=[Depends(_may_warm_up)])
async def sft(body: SftRequest, request: Request, ctx: AppContext = Depends(app_context)) -> SftResult:
    return await ctx.core.sft(body)


@router.post(f"{API_PREFIX}/control/{{action}}", response_model=ControlResult, dependencies=_CONTROL)
async def control(action: ControlAction, request: Request, ctx: AppContext = Depends(app_context)) -> ControlResult:
    """Pause, resume, checkpoint or stop.

    A ``stop`` whose checkpoint fails still stops (the caller asked to stop, and a server stuck in
    ``stopping`` refuses every claim): the failure is logged, published as an ``error`` event
    (``where=checkpoint``) and kept as ``last_error``; the answer is 200 with ``checkpoint_error`` in
    ``detail`` instead of ``path``; and ``swarm serve`` exits with code 2 after the graceful
    shutdown (well within 15 s), naming the failure, so a supervisor sees that the state dir holds
    only the previous checkpoint (a restart resumes from it and retrains what came after)."""
    core = ctx.core
    detail: dict[str, object] = {}
    if action is ControlAction.pause:
        core.pause()
    elif action is ControlAction.resume:
        core.resume()
    elif action is ControlAction.checkpoint:
        try:
            detail.update(_checkpoint_detail(await core.checkpoint()))
        except Exception as exc:
            message = _report_checkpoint_failure(core, exc)
            if core.disk.explains(exc):
                raise InsufficientStorage(f"the checkpoint could not be written, the disk is full: {message}; the "
                                          "server runs on with its previous checkpoint",
                                          detail=core.disk.check().model_dump(), retry_after=RETRY_AFTER_S) from None
            raise ApiError(f"the checkpoint failed: {message}; the server runs on with its previous checkpoint",
                           status=500, code=ErrorCode.internal) from None
    elif action is ControlAction.stop:
        core.stopping()
        try:
            detail.update(_checkpoint_detail(await core.checkpoint()))
        except Exception as exc:
            detail["checkpoint_error"] = message = _report_checkpoint_failure(core, exc)
            request.app.state.exit_error = f"the server stopped without its final checkpoint: {message}"
        shutdown = getattr(request.app.state, "request_shutdown", None)
        if shutdown is not None:
            # Let this response go out first, then ask uvicorn to exit gracefully.
            asyncio.get_running_loop().call_later(0.2, shutdown)
        else:
            log.warning("stop requested but no shutdown hook is installed; the core is stopping only")
        detail["shutting_down"] = shutdown is not None
    return ControlResult(action=action, state=core.state if action is not ControlAction.stop else ServerState.stopping,
                         detail=detail)


def _report_checkpoint_failure(core: ServerCore, exc: Exception) -> str:
    """Log and report a failed checkpoint (event + ``last_error``); returns its message."""
    log.error("checkpoint requested through the control API failed", exc_info=exc)
    core.report("checkpoint", exc)
    return str(exc) or type(exc).__name__


def _checkpoint_detail(path: Path) -> dict[str, object]:
    # ``weights`` is a loadable model folder (``swarm serve --model <weights>`` starts from it).
    return {"path": str(path), "weights": str(path / "weights")}
