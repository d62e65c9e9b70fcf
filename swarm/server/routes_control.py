"""Status, metrics, live config and control routes under ``/api/v1``, plus ``GET /healthz``.

Everything here except ``/healthz`` needs the control token (an episode key is a 403). ``checkpoint``
answers with the checkpoint directory (``path``) and its loadable model folder (``weights``).
``stop`` writes a checkpoint and then
asks the hosting uvicorn server to exit through ``app.state.request_shutdown`` (set by ``serve``).
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
    ServerState,
    SftRequest,
    SftResult,
    Status,
    StepMetrics,
)
from swarm.server.auth import require_control
from swarm.server.context import AppContext, app_context

log = logging.getLogger(__name__)

router = APIRouter()
_CONTROL = [Depends(require_control)]


@router.get("/healthz")
async def healthz(ctx: AppContext = Depends(app_context)) -> dict[str, object]:
    return {"ok": True, "state": ctx.engine.state.value, "policy_version": ctx.engine.policy_version}


@router.get(f"{API_PREFIX}/status", response_model=Status, dependencies=_CONTROL)
async def status(request: Request, ctx: AppContext = Depends(app_context)) -> Status:
    return ctx.engine.status()


@router.get(f"{API_PREFIX}/metrics", response_model=list[StepMetrics], dependencies=_CONTROL)
async def metrics(request: Request, since_step: int = Query(0, ge=0),
                  ctx: AppContext = Depends(app_context)) -> list[StepMetrics]:
    return ctx.engine.metrics_since(since_step)


@router.get(f"{API_PREFIX}/config", response_model=ConfigView, dependencies=_CONTROL)
async def get_config(request: Request, ctx: AppContext = Depends(app_context)) -> ConfigView:
    return ctx.engine.config_view()


@router.patch(f"{API_PREFIX}/config", response_model=ConfigView, dependencies=_CONTROL)
async def patch_config(body: ConfigPatch, request: Request, ctx: AppContext = Depends(app_context)) -> ConfigView:
    return ctx.engine.patch_config(body.values)


@router.post(f"{API_PREFIX}/control/sft", response_model=SftResult, dependencies=_CONTROL)
async def sft(body: SftRequest, request: Request, ctx: AppContext = Depends(app_context)) -> SftResult:
    return await ctx.engine.loop.sft(body, ctx.max_context)


@router.post(f"{API_PREFIX}/control/{{action}}", response_model=ControlResult, dependencies=_CONTROL)
async def control(action: ControlAction, request: Request, ctx: AppContext = Depends(app_context)) -> ControlResult:
    engine = ctx.engine
    detail: dict[str, object] = {}
    if action is ControlAction.pause:
        engine.pause()
    elif action is ControlAction.resume:
        engine.resume()
    elif action is ControlAction.checkpoint:
        detail.update(_checkpoint_detail(await engine.loop.checkpoint()))
    elif action is ControlAction.stop:
        engine.stopping()
        detail.update(_checkpoint_detail(await engine.loop.checkpoint()))
        shutdown = getattr(request.app.state, "request_shutdown", None)
        if shutdown is not None:
            # Let this response go out first, then ask uvicorn to exit gracefully.
            asyncio.get_running_loop().call_later(0.2, shutdown)
        else:
            log.warning("stop requested but no shutdown hook is installed; the engine is stopping only")
        detail["shutting_down"] = shutdown is not None
    return ControlResult(action=action, state=engine.state if action is not ControlAction.stop else ServerState.stopping,
                         detail=detail)


def _checkpoint_detail(path: Path) -> dict[str, object]:
    # ``weights`` is a loadable model folder (``swarm serve --model <weights>`` starts from it).
    return {"path": str(path), "weights": str(path / "weights")}
