"""Pool membership routes under ``/api/v1/workers``: a ``swarm worker`` joins, heartbeats, leaves.

They need the worker token (or the control token; ``swarm.server.auth``), which opens nothing else.
The roster (``swarm.pool.roster``) does the work; a heartbeat or leave for a worker the server no
longer knows (dropped after a missed lease) is a 404 that tells it to join again. ``GET`` lists the
members as ``/api/v1/status`` does (client token too).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from swarm.pool.roster import Roster, UnknownWorker
from swarm.pool.wire import WORKERS_PATH, Beat, BeatReply, Join, Joined
from swarm.protocol import WorkerStatus
from swarm.server.auth import require_client, require_worker
from swarm.server.errors import NotFound, Unavailable
from swarm.server.http.context import AppContext, app_context

router = APIRouter(prefix=WORKERS_PATH)
_WORKER = [Depends(require_worker)]


def _roster(ctx: AppContext) -> Roster:
    if ctx.roster is None:
        raise Unavailable("this server's generator pool takes no workers", retry_after=60.0)
    return ctx.roster


@router.post("", response_model=Joined, dependencies=_WORKER)
async def join(body: Join, request: Request, ctx: AppContext = Depends(app_context)) -> Joined:
    return await _roster(ctx).join(body)


@router.post("/{worker_id}/heartbeat", response_model=BeatReply, dependencies=_WORKER)
async def heartbeat(worker_id: str, body: Beat, request: Request, ctx: AppContext = Depends(app_context)) -> BeatReply:
    try:
        return await _roster(ctx).beat(worker_id, body)
    except UnknownWorker as exc:
        raise NotFound(str(exc)) from None


@router.delete("/{worker_id}", dependencies=_WORKER)
async def leave(worker_id: str, request: Request, ctx: AppContext = Depends(app_context)) -> dict[str, bool]:
    try:
        _roster(ctx).leave(worker_id)
    except UnknownWorker as exc:
        raise NotFound(str(exc)) from None
    return {"ok": True}


@router.get("", response_model=list[WorkerStatus], dependencies=[Depends(require_client)])
async def members(request: Request, ctx: AppContext = Depends(app_context)) -> list[WorkerStatus]:
    return ctx.core.generator.workers()
