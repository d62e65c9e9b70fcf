"""Implicit episodes behind a run key: one credential for a whole run, an episode per conversation.

A framework that takes one base URL and one key for a whole run (verifiers' ``vf-eval``, an eval
harness, one openai client) holds a run key (``swarm.server.auth``; ``POST /api/v1/runs``, ``swarm
key --run NAME``). ``RunEpisodes.target`` maps each of its chat calls to an episode:

- a call with an ``X-Session-ID`` header (verifiers sends its rollout's trace id in it on every
  turn) belongs to that session's episode: its first call opens one, later calls continue it, and a
  reward may be posted by the session id with the run key. Sessions settle what prefixes cannot: two
  rollouts whose first replies were the same;
- without one, a call that re-sends a reply an open episode of the run sampled continues that
  episode. This is drift repair's look-up (``swarm.text.drift.Conversation.splice``), so the call's prompt is
  that episode's own tokens plus the new messages and it merges into the episode's timeline token for
  token: the same machinery as a claimed episode's multi-turn merge, no second matcher. Where several
  open episodes sampled the same reply (members of one GRPO group can), the one whose conversation
  ends there (not continued past it yet) wins, then the oldest;
- any other call opens a new training episode through the claim path (``ServerCore.open_training``:
  pause, sync drains, category ratios, admission, each a 429 with ``Retry-After`` as for a claim),
  in the group keyed by its conversation (messages, tools and template variables: what its prompt
  is rendered from), so ``group_size`` repeats of one prompt form one GRPO group.

Each recorded response is named (``name``): the id the client saw (``chatcmpl-…``, ``resp_…``) maps
to its episode, so a reward may be posted by response id (``resolve``). Those ids and the episodes'
runs are kept for the newest ``max_names`` (in memory: a restart forgets them, and the episodes in
flight with them). An episode nobody rewards expires by its lease, like any other. The look-up walks
the run's open episodes, one dictionary probe per message each, cheap next to a generation.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Protocol

from swarm.protocol import AbortRequest, ChatCompletionRequest, ClaimRequest, EpisodeState
from swarm.server.auth import Principal
from swarm.server.episodes.lifecycle import Lifecycle
from swarm.server.errors import BadRequest, NotFound
from swarm.server.records.episode import EpisodeRecord
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.view import ServerView
from swarm.text.drift import Conversation, Splice

__all__ = ["RESPONSE_PREFIXES", "SESSION_HEADER", "RunEpisodes", "TrainingClaims"]

RESPONSE_PREFIXES = ("chatcmpl-", "resp_")  # the ids a client sees; an episode id is bare hex
SESSION_HEADER = "x-session-id"  # verifiers sends its rollout's trace id in it, every turn
_MAX_SESSION = 256


class TrainingClaims(Protocol):
    """Where a run key's new conversation is claimed (``swarm.server.core.ServerCore``)."""

    def open_training(self, request: ClaimRequest) -> EpisodeRecord:
        """A training episode, admitted as any claim is (429 when it may not start now)."""


class RunEpisodes:
    """Which episode each run-key call belongs to, and which episode each response id names. New
    conversations are claimed through ``claims``; an episode whose first call failed is aborted
    through ``lifecycle``."""

    def __init__(self, view: ServerView, *, episodes: EpisodeRegistry, claims: TrainingClaims, lifecycle: Lifecycle,
                 max_names: int = 100_000) -> None:
        self._view = view
        self._episodes = episodes
        self._claims = claims
        self._lifecycle = lifecycle
        self._max_names = max_names
        self._open: dict[str, list[str]] = {}  # run -> its episodes that may be live (pruned on each look-up)
        self._run_of: OrderedDict[str, str] = OrderedDict()  # episode id -> the run that opened it
        self._responses: OrderedDict[str, str] = OrderedDict()  # response id -> episode id
        self._sessions: OrderedDict[str, str] = OrderedDict()  # _session_key(run, session) -> episode id

    async def target(self, principal: Principal, request: ChatCompletionRequest,
                     session: str | None = None) -> tuple[str | None, bool]:
        """The episode a chat call is recorded into, and whether this call opened it: an episode key's
        own; for a run key its session's or the open episode it continues, else a new one; none for
        the control token."""
        run = principal.run
        if run is None:
            return principal.episode_id, False
        if session is not None and not 0 < len(session) <= _MAX_SESSION:
            raise BadRequest(f"the {SESSION_HEADER} header must hold 1 to {_MAX_SESSION} characters")
        defaults = self._view.config.chat_template_kwargs
        try:  # hashing a long conversation stays off the event loop, as rendering does
            talk = await asyncio.to_thread(_keyed, request, defaults)
        except ValueError as exc:
            raise BadRequest(f"the chat template cannot render these messages: {exc}") from None
        episode = self._of_session(run, session) if session is not None else self._continued(run, talk)
        if episode is not None:
            return episode.episode_id, False
        return self._opened(run, talk, session), True

    def discard(self, episode_id: str, exc: BaseException) -> None:
        """Abort an episode whose first call failed before it started (a 4xx, a 429, a disconnect), so
        it does not hold its group until its lease runs out."""
        self._lifecycle.abort(episode_id, AbortRequest(reason=f"its first call failed: {exc or type(exc).__name__}"))

    def _continued(self, run: str, talk: Conversation) -> EpisodeRecord | None:
        """The open episode of ``run`` whose reply this conversation re-sends last (module docstring)."""
        live: list[str] = []
        best: EpisodeRecord | None = None
        best_rank = (-1, False)
        for episode_id in self._open.get(run, ()):
            episode = self._episodes.held(episode_id)
            if episode is None or episode.state is not EpisodeState.claimed:
                continue
            live.append(episode_id)
            splice = talk.splice(episode.replies)
            if splice is not None and (rank := (splice.index, _ends_at(episode, splice))) > best_rank:
                best, best_rank = episode, rank
        self._open[run] = live
        return best

    def _of_session(self, run: str, session: str) -> EpisodeRecord | None:
        """The live episode of this session of ``run``, if it has one."""
        episode_id = self._sessions.get(_session_key(run, session))
        episode = self._episodes.held(episode_id) if episode_id is not None else None
        return episode if episode is not None and episode.state is EpisodeState.claimed else None

    def _opened(self, run: str, talk: Conversation, session: str | None) -> str:
        """A new episode of ``run`` in the group of this conversation (a 429 when it may not start now),
        found again by its session, or else by the replies it samples."""
        task_id = f"{run}:{talk.keys[-1].hex()[:24]}"
        episode_id = self._claims.open_training(ClaimRequest(task_id=task_id, client_id=f"run:{run}")).episode_id
        if session is not None:
            self._remember(self._sessions, _session_key(run, session), episode_id)
        else:
            self._open.setdefault(run, []).append(episode_id)
        self._remember(self._run_of, episode_id, run)
        return episode_id

    def name(self, response_id: str, episode_id: str | None) -> None:
        """Note that the response ``response_id`` was recorded into ``episode_id`` (if any)."""
        if episode_id is not None:
            self._remember(self._responses, response_id, episode_id)

    def resolve(self, id_: str, run: str | None = None) -> str:
        """The episode a path names: a response id is looked up (404 if unknown); for a run key's
        caller (``run``) so is a session id of that run; anything else is taken as an episode id."""
        if not id_.startswith(RESPONSE_PREFIXES):
            session = self._sessions.get(_session_key(run, id_)) if run is not None else None
            return session if session is not None else id_
        episode_id = self._responses.get(id_)
        if episode_id is None:
            raise NotFound(f"unknown response id {id_}: no response recorded into an episode had it (a call with "
                           f"the control token is recorded nowhere; this server keeps the newest {self._max_names} "
                           "and forgets them on restart); post by episode id, the x-swarm-episode header")
        return episode_id

    def run_of(self, episode_id: str) -> str | None:
        """The run that opened ``episode_id``; None for a claimed episode (or one long forgotten)."""
        return self._run_of.get(episode_id)

    def _remember(self, book: OrderedDict[str, str], key: str, value: str) -> None:
        book[key] = value
        while len(book) > self._max_names:
            book.popitem(last=False)


def _keyed(request: ChatCompletionRequest, defaults: dict[str, object]) -> Conversation:
    """The conversation with its keys computed (called off the event loop)."""
    talk = Conversation(request, dict(defaults))
    _ = talk.keys
    return talk


def _session_key(run: str, session: str) -> str:
    return f"{run}\n{session}"  # a run's name holds no newline


def _ends_at(episode: EpisodeRecord, splice: Splice) -> bool:
    """Whether a timeline of ``episode`` ends with the spliced reply (not continued past it yet)."""
    return any(len(t.tokens) == len(splice.tokens) for t in episode.trace.timelines)
