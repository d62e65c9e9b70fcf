"""Episode routes: claim, heartbeat, finish, abort, and look-up, under ``/api/v1/episodes``.

Claims need the control token or the client token (``swarm.server.auth``). Heartbeat, finish, abort
and look-up accept either of those or the episode's own key (another episode's key is a 403). The
engine does the work and raises the 4xx errors; these handlers only authenticate and translate.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from swarm.protocol import API_PREFIX, AbortRequest, ClaimRequest, Episode, EpisodeStatus, FinishRequest
from swarm.server.auth import require_client, require_episode
from swarm.server.http.context import AppContext, app_context

router = APIRouter(prefix=f"{API_PREFIX}/episodes")
_EPISODE = [Depends(require_episode)]


def _base_url(request: Request) -> str:
    # The address the client used to reach us, so the episode's base_url works from where it is.
    return str(request.base_url).rstrip("/") + "/v1"


@router.post("", response_model=Episode, dependencies=[Depends(require_client)])
async def claim(body: ClaimRequest, request: Request, ctx: AppContext = Depends(app_context)) -> Episode:
    return await ctx.engine.claim(body, _base_url(request))


@router.get("/{episode_id}", response_model=EpisodeStatus, dependencies=_EPISODE)
async def get_episode(episode_id: str, request: Request, ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.status_of(episode_id)


@router.post("/{episode_id}/heartbeat", response_model=EpisodeStatus, dependencies=_EPISODE)
async def heartbeat(episode_id: str, request: Request, ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.heartbeat(episode_id)


@router.post("/{episode_id}/finish", response_model=EpisodeStatus, dependencies=_EPISODE)
async def finish(episode_id: str, body: FinishRequest, request: Request,
                 ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.finish(episode_id, body)


@router.post("/{episode_id}/abort", response_model=EpisodeStatus, dependencies=_EPISODE)
async def abort(episode_id: str, request: Request, body: AbortRequest | None = None,
                ctx: AppContext = Depends(app_context)) -> EpisodeStatus:
    return ctx.lifecycle.abort(episode_id, body or AbortRequest())
