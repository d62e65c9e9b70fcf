"""One claimed episode: its credentials, background heartbeats, and a guaranteed end.

An ``EpisodeHandle`` keeps its lease alive from a daemon thread (every lease/3 seconds) and always
ends the episode: ``finish`` with a reward, or ``abort``. Used as a context manager, an exception
inside the block aborts the episode with a traceback summary (then propagates), and leaving the
block without ``finish`` aborts it as "finished without reward" — a lease is never silently lost.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from types import TracebackType
from typing import TYPE_CHECKING, Any

from swarm.client._errors import SwarmError, SwarmHTTPError
from swarm.client._transport import Transport
from swarm.protocol import API_PREFIX, AbortRequest, Episode, EpisodeStatus, FinishRequest

if TYPE_CHECKING:  # openai costs ~1.5 s to import: only when an agent asks for a client
    from openai import AsyncOpenAI, OpenAI  # by name: inside EpisodeHandle, ``openai`` is its method

log = logging.getLogger(__name__)

_TERMINAL_CODES = {404, 409, 410}  # the episode is already over (or unknown) on the server
_ABORT_WINDOW_S = 5.0  # an abort is best effort: an unreachable server expires the lease itself
_MAX_BEAT_S = 20.0


class OpenAIPool:
    """One ``openai.OpenAI`` root client (one connection pool) per ``SwarmClient``, built on first use."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._client: Any = None

    def client(self) -> OpenAI:
        with self._lock:
            if self._client is None:
                import openai as _openai

                # Placeholder credentials: every episode uses a copy with its own key and base_url.
                self._client = _openai.OpenAI(api_key="unset", base_url="http://unset.invalid/v1",
                                              timeout=self.timeout, max_retries=2)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class EpisodeHandle:
    """A claimed episode. ``base_url`` + ``api_key`` open an OpenAI-compatible endpoint bound to it."""

    def __init__(self, transport: Transport, episode: Episode, openai_pool: OpenAIPool, *,
                 lease_s: float | None = None) -> None:
        self.episode = episode
        self._transport = transport
        self._openai_pool = openai_pool
        self._path = f"{API_PREFIX}/episodes/{episode.episode_id}"
        self._state: str | None = None  # None while open, then "finished" / "aborted" / "lost"
        self._lock = threading.Lock()
        self._openai: Any = None
        self.reward: float | None = None  # set by a successful finish
        lease = lease_s if lease_s is not None else episode.lease_expires_at - time.time()
        # lease/3 leaves two spare beats; the cap bounds the damage of a skewed clock between hosts.
        self.heartbeat_interval_s = min(_MAX_BEAT_S, max(0.2, lease / 3))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeats, name=f"heartbeat-{episode.episode_id}",
                                        daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- identity

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def task_id(self) -> str:
        return self.episode.task_id

    @property
    def group_id(self) -> str:
        return self.episode.group_id

    @property
    def base_url(self) -> str:
        return self.episode.base_url

    @property
    def api_key(self) -> str:
        return self.episode.api_key

    @property
    def policy_version(self) -> int:
        return self.episode.policy_version

    @property
    def state(self) -> str | None:
        """``None`` while open; ``"finished"``, ``"aborted"`` or ``"lost"`` (lease gone) after."""
        return self._state

    @property
    def done(self) -> bool:
        return self._state is not None

    # ---------------------------------------------------------------- agents

    def openai(self, **kwargs: Any) -> OpenAI:
        """An ``openai.OpenAI`` client for this episode; ``kwargs`` override its options.

        Episodes of one ``SwarmClient`` share one connection pool (``with_options`` copies), so a
        run of thousands of episodes does not open thousands of connections.
        """
        if kwargs:
            return self._openai_pool.client().with_options(api_key=self.api_key, base_url=self.base_url, **kwargs)
        if self._openai is None:
            self._openai = self._openai_pool.client().with_options(api_key=self.api_key, base_url=self.base_url)
        return self._openai

    def async_openai(self, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client for this episode (new each call; the caller closes it)."""
        import openai as _openai

        options: dict[str, Any] = {"timeout": self._openai_pool.timeout, "max_retries": 2}
        return _openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **{**options, **kwargs})

    # ---------------------------------------------------------------- ending

    def finish(self, reward: float, metrics: dict[str, float] | None = None,
               metadata: dict[str, Any] | None = None) -> EpisodeStatus:
        """Post the reward. Retried safely: finishing twice with the same body is a server no-op. On a
        full server disk (507) it is retried until the server commits it (the server renews the lease
        meanwhile): the episode counts as finished only once the server acknowledged it."""
        request = FinishRequest(reward=reward, metrics=metrics or {}, metadata=metadata or {})
        with self._lock:
            if self._state in ("aborted", "lost"):
                raise SwarmError(f"episode {self.episode_id} is already {self._state}; cannot finish it")
            self._stop.set()
            response = self._transport.request("POST", f"{self._path}/finish", body=request, bearer=self.api_key)
            self._state = "finished"
            self.reward = request.reward
        return EpisodeStatus.model_validate_json(response.content)

    def abort(self, reason: str = "aborted by client") -> None:
        """End the episode without training on it. Best effort: never raises for a dead episode."""
        with self._lock:
            if self._state is not None:
                return
            self._stop.set()
            self._state = "aborted"
            try:
                self._transport.request("POST", f"{self._path}/abort", body=AbortRequest(reason=reason[-2000:]),
                                        bearer=self.api_key, retry_for_s=_ABORT_WINDOW_S)
            except SwarmHTTPError as exc:
                if exc.status not in _TERMINAL_CODES:
                    raise
                log.debug("abort of %s: already over (%s)", self.episode_id, exc)
            except SwarmError as exc:
                log.warning("could not abort episode %s (its lease will expire): %s", self.episode_id, exc)

    def close(self) -> None:
        """Stop heartbeats and close the cached OpenAI client (does not end the episode)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._openai = None  # a view on the shared pool: closing it would close the pool

    def __enter__(self) -> EpisodeHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is not None:
                summary = "".join(traceback.format_exception(exc_type, exc, tb, limit=-3))
                self.abort(f"client error: {summary}")
            elif self._state is None:
                self.abort("finished without reward")
        finally:
            self.close()

    # ---------------------------------------------------------------- lease

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_s):
            try:
                self._transport.request("POST", f"{self._path}/heartbeat", bearer=self.api_key,
                                        retry_for_s=self.heartbeat_interval_s)
            except SwarmHTTPError as exc:
                if exc.status in _TERMINAL_CODES and not self._stop.is_set():
                    log.warning("episode %s lost its lease: %s", self.episode_id, exc)
                    with self._lock:
                        if self._state is None:
                            self._state = "lost"
                    return
                log.warning("heartbeat for %s refused: %s", self.episode_id, exc)
            except SwarmError as exc:
                log.warning("heartbeat for %s failed: %s", self.episode_id, exc)
