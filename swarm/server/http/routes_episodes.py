"""Episode routes: claim, heartbeat, finish, abort, and look-up, under ``/api/v1/episodes``; run keys
under ``/api/v1/runs``.

Claims and run keys need the control token or the client token (``swarm.server.auth``). Heartbeat,
finish, abort and look-up accept either of those, the episode's own key, or the key of the run that
opened it (any other key is a 403); the path names the episode by its id or by the id of a response
recorded into it (``chatcmpl-…``, ``resp_…``: ``swarm.server.episodes.runs``), so a one-key framework posts
its rewards by the response it saw. The core does the work and raises the 4xx errors; these
handlers only authenticate and translate.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from swarm.protocol import (
    API_PREFIX,
    AbortRequest,
    ClaimRequest,
    Episode,
    EpisodeStatus,
    FinishRequest,
    RunKey,
    RunKeyRequest,
)
from swarm.server.auth import require_client, require_episode
from swarm.server.http.context import AppContext, app_context

router = APIRouter(prefix=API_PREFIX)


def _base_url(request: Request) -> str:
    # The address the client used to reach us, so the episode's base_url works from where it is.
    return str(request.base_url).rstrip("/") + "/v1"


@router.post("/episodes", response_model=Episode, dependencies=[Depends(require_client)])
async def claim(body: ClaimRequest, request: Request, ctx: AppContext = Depends(app_context)) -> Episode:
    return await ctx.core.claim(body, _base_url(request))


@router.post("/runs", response_model=RunKey, dependencies=[Depends(require_client)])
async def run_key(body: RunKeyRequest, request: Request, ctx: AppContext = Depends(app_context)) -> RunKey:
    """One key for a whole run: each conversation it sends opens or continues an episode of its own."""
    return RunKey(run=body.run, base_url=_base_url(request), api_key=ctx.keys.run_key(body.run))


@router.get("/episodes/{episode_id}", response_model=EpisodeStatus)
async def get_episode(target: str = Depends(require_episode), ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.status_of(target)


@router.post("/episodes/{episode_id}/heartbeat", response_model=EpisodeStatus)
async def heartbeat(target: str = Depends(require_episode), ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.heartbeat(target)


@router.post("/episodes/{episode_id}/finish", response_model=EpisodeStatus)
async def finish(body: FinishRequest, target: str = Depends(require_episode),
                 ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.finish(target, body)


@router.post("/episodes/{episode_id}/abort", response_model=EpisodeStatus)
async def abort(body: AbortRequest | None = None, target: str = Depends(require_episode),
                ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.abort(target, body or AbortRequest())
