"""``SwarmClient``: claim episodes on one swarm server and drive its control API.

Every response is parsed with the models of ``swarm.protocol`` (the wire contract the server
validates with), so the two ends cannot drift apart silently. Retries follow ``_transport``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from swarm.client._episode import EpisodeHandle, OpenAIPool
from swarm.client._errors import SwarmError, SwarmHTTPError, SwarmUnavailable
from swarm.client._events import iter_events
from swarm.client._run_state import Task
from swarm.client._runner import RunSummary, run_workflow
from swarm.client._transport import Credential, Transport
from swarm.protocol import (
    API_PREFIX,
    ClaimRequest,
    ConfigPatch,
    ConfigView,
    ControlAction,
    ControlResult,
    Episode,
    EpisodeStatus,
    Event,
    FinishRequest,
    Purpose,
    RunKey,
    RunKeyRequest,
    SftExample,
    SftRequest,
    SftResult,
    Status,
    StepMetrics,
)

_METRICS = TypeAdapter(list[StepMetrics])
_SFT_TIMEOUT_S = 1800.0  # a warm-up runs many optimizer steps in one request


class SwarmClient:
    """A client of one swarm server.

    Two credentials (``swarm.server.auth``). ``token`` is the control token (config, control, SFT,
    metrics, events); like the OpenAI SDK with ``OPENAI_API_KEY`` it defaults to the ``SWARM_TOKEN``
    environment variable, then to ``token_file`` (``<state-dir>/token``, written by ``swarm serve``
    on loopback). ``client_token`` is what claims are sent with; it defaults to ``SWARM_CLIENT_TOKEN``,
    then to ``client_token_file`` (``<state-dir>/client_token``), then to the control token. Study code
    holding only a client token can claim and run episodes and read ``status``; a control call is
    answered 403. ``retry_for_s`` bounds how long one call keeps retrying an unreachable server.
    """

    def __init__(self, url: str, token: str | None = None, *, client_token: str | None = None,
                 client_id: str | None = None, timeout: float = 30, retry_for_s: float = 120,
                 token_file: str | Path | None = None, client_token_file: str | Path | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        if token is None:
            token = os.environ.get("SWARM_TOKEN") or None
        if client_token is None:
            client_token = os.environ.get("SWARM_CLIENT_TOKEN") or None
        self.url = url.rstrip("/")
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:8]}"
        control = Credential(token, Path(token_file) if token_file else None)
        client = Credential(client_token, Path(client_token_file) if client_token_file else None)
        self._transport = Transport(self.url, control=control, client=client, timeout=timeout,
                                    retry_for_s=retry_for_s)
        # Generation can queue: a real model on CPU answers 32 concurrent 96-token calls in minutes, and a
        # call that times out is re-sent from scratch (its episode aborted after the retries): wait long.
        self._openai_pool = OpenAIPool(timeout=max(float(timeout), 600.0))

    @property
    def openai_pool(self) -> OpenAIPool:
        """The connection pool every episode's ``ep.openai()`` shares."""
        return self._openai_pool

    @property
    def token(self) -> str | None:
        """The control token, if this client has one."""
        return self._transport.token

    @property
    def client_token(self) -> str | None:
        """The credential claims are sent with: the client token, else the control token."""
        return self._transport.client_token

    def close(self) -> None:
        self.openai_pool.close()
        self._transport.close()

    def stop_retrying(self) -> None:
        """From now on every call is tried once: a failure raises instead of retrying for
        ``retry_for_s`` (``run`` calls this when interrupted, so a run whose server is gone ends at once)."""
        self._transport.stop_retrying()

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---------------------------------------------------------------- episodes

    def claim(self, task_id: str, *, group_id: str | None = None, group_size: int | None = None,
              category: str | None = None, lease_s: float | None = None, purpose: Purpose = "train",
              eval_every: int | None = None,
              while_refused: Callable[[SwarmHTTPError], None] | None = None) -> EpisodeHandle:
        """Claim one episode (idempotent across retries) and start its heartbeats. ``purpose="eval"``
        claims a held-out evaluation episode (never grouped or trained; see ``protocol.ClaimRequest``);
        its ``eval_every`` tells the server the cadence, so it holds each such step for its round.
        A claim the server refuses for now (429 + ``Retry-After``: paused, a sync drain, admission) is
        retried after the wait it names; ``while_refused`` gets each such answer before its wait
        (``run`` starts a held-out round its ``detail`` step calls for, or plays a queued held-out
        episode there, so a round never waits on workers that wait on its step).

        Prefer ``episode()``, which also guarantees the episode ends.
        """
        request = ClaimRequest(task_id=task_id, group_id=group_id, group_size=group_size, category=category,
                               client_id=self.client_id, lease_s=lease_s, request_id=uuid.uuid4().hex,
                               purpose=purpose, eval_every=eval_every)
        response = self._transport.request("POST", f"{API_PREFIX}/episodes", body=request, as_client=True,
                                           while_refused=while_refused)
        episode = Episode.model_validate_json(response.content)
        return EpisodeHandle(self._transport, episode, self.openai_pool, lease_s=lease_s)

    @contextmanager
    def episode(self, task_id: str, *, group_id: str | None = None, group_size: int | None = None,
                category: str | None = None, lease_s: float | None = None,
                purpose: Purpose = "train") -> Iterator[EpisodeHandle]:
        """Claim an episode for the ``with`` block; an exception or a missing ``finish`` aborts it."""
        handle = self.claim(task_id, group_id=group_id, group_size=group_size, category=category, lease_s=lease_s,
                            purpose=purpose)
        with handle:
            yield handle

    def run(self, tasks: Iterable[Task], workflow: Callable[[EpisodeHandle, Task], float | None],
            *, group_size: int = 8, concurrency: int = 16, episodes: int | None = None,
            category: str | None = None, progress: bool = True, heldout: list[Task] | None = None,
            eval_every: int = 0, eval_samples: int = 1) -> RunSummary:
        """Run ``workflow`` over ``tasks``, ``group_size`` episodes per task; with ``heldout`` tasks and
        ``eval_every`` > 0, also evaluate them at step 0 and every ``eval_every`` steps, each task
        ``eval_samples`` times a round (the server then reports ``eval/reward_mean_sd``, the round's
        sampling noise); see ``swarm.client._runner``."""
        return run_workflow(self, tasks, workflow, group_size=group_size, concurrency=concurrency,
                            episodes=episodes, category=category, progress=progress, heldout=heldout,
                            eval_every=eval_every, eval_samples=eval_samples)

    def episode_status(self, episode_id: str) -> EpisodeStatus:
        """Where one episode stands on the server (claimed, finished, aborted, expired)."""
        response = self._transport.request("GET", f"{API_PREFIX}/episodes/{episode_id}", as_client=True)
        return EpisodeStatus.model_validate_json(response.content)

    def run_key(self, run: str) -> RunKey:
        """One key for a whole run: a framework that takes one ``base_url`` and ``api_key`` for all
        its rollouts gets an episode per conversation (``swarm.server.episodes.runs``); post each reward with
        ``finish`` by the episode (``x-swarm-episode``) or the id of the response it answers."""
        response = self._transport.request("POST", f"{API_PREFIX}/runs", body=RunKeyRequest(run=run), as_client=True)
        return RunKey.model_validate_json(response.content)

    def finish(self, episode_or_response_id: str, reward: float, *, metrics: dict[str, float] | None = None,
               metadata: dict[str, Any] | None = None) -> EpisodeStatus:
        """Finish an episode named by its id or by a response id recorded into it (a run key's, usually)."""
        body = FinishRequest(reward=reward, metrics=metrics or {}, metadata=metadata or {})
        response = self._transport.request("POST", f"{API_PREFIX}/episodes/{episode_or_response_id}/finish",
                                           body=body, as_client=True)
        return EpisodeStatus.model_validate_json(response.content)

    # ---------------------------------------------------------------- observing

    def health(self) -> bool:
        """True when ``/healthz`` answers 2xx right now (no retries)."""
        try:
            self._transport.request("GET", "/healthz", retry_for_s=0, timeout=min(5.0, self._transport.timeout))
        except SwarmError:
            return False
        return True

    def wait_ready(self, timeout_s: float = 60.0) -> Status:
        """Block until the server answers ``/api/v1/status``; raises ``SwarmUnavailable`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.status(retry_for_s=0)
            except SwarmUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def status(self, *, retry_for_s: float | None = None) -> Status:
        response = self._transport.request("GET", f"{API_PREFIX}/status", retry_for_s=retry_for_s)
        return Status.model_validate_json(response.content)

    def metrics(self, since_step: int = 0) -> list[StepMetrics]:
        """Per-step training metrics of steps after ``since_step`` (``step > since_step``; slash keys such
        as ``train/reward_mean``)."""
        response = self._transport.request("GET", f"{API_PREFIX}/metrics", params={"since_step": since_step})
        return _METRICS.validate_json(response.content)

    def events(self, last_event_id: int | None = None, *, reconnect: bool = True) -> Iterator[Event]:
        """The server's live event stream; resumes after a dropped connection via ``Last-Event-ID``."""
        return iter_events(self._transport, last_event_id=last_event_id, reconnect=reconnect)

    # ---------------------------------------------------------------- control

    def config(self) -> ConfigView:
        response = self._transport.request("GET", f"{API_PREFIX}/config")
        return ConfigView.model_validate_json(response.content)

    def patch_config(self, **values: Any) -> ConfigView:
        """Change live settings (validated as a whole by the server, which bumps the config version)."""
        response = self._transport.request("PATCH", f"{API_PREFIX}/config", body=ConfigPatch(values=values))
        return ConfigView.model_validate_json(response.content)

    def control(self, action: ControlAction | str) -> ControlResult:
        """``pause``, ``resume``, ``checkpoint`` or ``stop``."""
        try:
            action = ControlAction(action)
        except ValueError:
            raise ValueError(f"unknown control action {action!r}; use one of "
                             f"{[a.value for a in ControlAction]}") from None
        response = self._transport.request("POST", f"{API_PREFIX}/control/{action.value}",
                                           idempotent=action in (ControlAction.pause, ControlAction.resume))
        return ControlResult.model_validate_json(response.content)

    def sft(self, examples: Iterable[SftExample | dict[str, Any]], steps: int, batch_size: int = 16,
            lr: float | None = None) -> SftResult:
        """A supervised warm-up on ``examples`` (messages + the assistant completion to learn)."""
        request = SftRequest(examples=[SftExample.model_validate(e) for e in examples], steps=steps,
                             batch_size=batch_size, lr=lr)
        response = self._transport.request("POST", f"{API_PREFIX}/control/sft", body=request, idempotent=False,
                                           timeout=_SFT_TIMEOUT_S)
        return SftResult.model_validate_json(response.content)

