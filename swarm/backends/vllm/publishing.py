"""The weight half of ``VllmGenerator``: publishing versions into vLLM and recovering from a failed one.

A publication (``load_weights``, or ``load_streamed`` when the trainer streams its own weights over
NCCL) stages the weights through the generator's ``transfer`` while requests still run, then holds
new requests back, waits for the running ones (they finish on the old weights and keep the old
version), applies the weights (wrapped in vLLM's ``/pause``/``/resume`` in sync mode), resets the
prefix cache and moves the version. Any failure raises ``WeightSyncError`` with the version
unmoved; a caller that gives up waiting cancels it (the transfer is reset either way, so a stuck
NCCL group is abandoned). ``recover`` then writes the weights to a folder and restarts vLLM on it.

A mixin: it uses the generator's state (``server``, ``transfer``, the request gate ``_open``/``_idle``,
``_update_lock``, the serving folder and its version) and its restart machinery, all named by
``PublishingHost``, the self-type of its methods (so this module never imports the generator).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

from swarm.backends.base import Weights
from swarm.backends.vllm.completions import raise_for_status
from swarm.backends.vllm.errors import GeneratorUnavailable, WeightSyncError
from swarm.backends.vllm.process import AttachedVllm, VllmProcess
from swarm.weights.folder import prune_weight_folders, write_weights_folder
from swarm.weights.transfer import WeightTransfer

logger = logging.getLogger(__name__)

__all__ = ["PublishingHost", "WeightPublishing"]

_RESUME_TIMEOUT_S = 10.0


class PublishingHost(Protocol):
    """What ``WeightPublishing`` uses of the generator it is mixed into (``VllmGenerator``)."""

    # read only here
    @property
    def server(self) -> VllmProcess | AttachedVllm: ...
    @property
    def transfer(self) -> WeightTransfer: ...
    @property
    def mode(self) -> str: ...
    @property
    def model_dir(self) -> Path: ...
    @property
    def weights_dtype(self) -> str | None: ...
    @property
    def _weights_root(self) -> Path: ...
    @property
    def _open(self) -> asyncio.Event: ...  # the request gate: cleared while weights are swapped
    @property
    def _idle(self) -> asyncio.Event: ...  # set when no request is in flight
    @property
    def _update_lock(self) -> asyncio.Lock: ...
    @property
    def _restarting(self) -> asyncio.Task[None] | None: ...

    # moved by a publication
    _version: int
    _serving_folder: Path
    _folder_version: int
    weight_sync_s: float
    last_error: str | None

    async def _restart_locked(self) -> None: ...
    def _require_client(self) -> httpx.AsyncClient: ...
    def _report(self) -> None: ...
    def _retry_after(self) -> float: ...
    # this mixin's own helpers, called through the self-type
    async def _publish(self, version: int, weights: Weights | None) -> None: ...
    async def _swap(self, version: int, staged: Path | None, apply: Callable[[], Any]) -> None: ...


class WeightPublishing:
    """``load_weights``/``load_streamed``/``recover`` for ``VllmGenerator`` (see the module docstring)."""

    last_error: str | None  # a failed publication says why here (the generator's status reports it)

    async def load_weights(self: PublishingHost, version: int, weights: Weights) -> None:
        """Serve ``weights`` as ``version``: requests in flight finish on the old weights first.

        ``WeightSyncError`` if the publication fails in any way (vLLM down, weights refused, the
        transfer broken): vLLM may then hold half-updated weights; ``recover`` restarts it on them.
        """
        await self._publish(version, weights)

    @property
    def streams_weights(self: PublishingHost) -> bool:
        """True when the trainer streams its weights into vLLM itself (NCCL from its workers): the
        server's publication then calls ``load_streamed`` and never gathers a state dict for this generator."""
        return self.transfer.streams

    async def load_streamed(self: PublishingHost, version: int) -> None:
        """Serve the weights the trainer streams now (``streams_weights``) as ``version``."""
        await self._publish(version, None)

    async def recover(self: PublishingHost, version: int, weights: Weights) -> None:
        """After a failed publication: restart vLLM on ``weights`` (written to a folder, bf16 on GPU)
        and serve them as ``version``; an attached server reloads the folder. ``VllmStartError`` if
        vLLM does not come back (the watchdog keeps trying from that folder)."""
        restarting = self._restarting
        if restarting is not None and not restarting.done():  # superseded: this one boots newer weights
            restarting.cancel()
            await asyncio.gather(restarting, return_exceptions=True)
        async with self._update_lock:
            folder = await asyncio.to_thread(write_weights_folder, weights, self.model_dir, self._weights_root,
                                             version, self.weights_dtype)
            self._serving_folder, self._folder_version = folder, version
            await self._restart_locked()
            await asyncio.to_thread(prune_weight_folders, self._weights_root, folder)

    async def _publish(self: PublishingHost, version: int, weights: Weights | None) -> None:
        async with self._update_lock:
            started = time.monotonic()
            try:
                # Staged while requests still run (the disk transfer writes its folder here).
                staged = await self.transfer.stage(version, weights)
                await self._swap(version, staged, lambda: self.transfer.apply(
                    self.server.url, self._require_client(), staged, weights))
            except asyncio.CancelledError:  # the caller gave up waiting: whatever was sent is abandoned
                self.transfer.reset()
                raise
            except Exception as exc:
                self.transfer.reset()
                self.last_error = f"publishing version {version} failed: {exc!r}"
                self._report()
                raise WeightSyncError(f"vLLM did not take policy version {version}: {exc!r}") from exc
            self.weight_sync_s = time.monotonic() - started
            logger.info("vLLM serves policy version %d (%s, %.2f s)", version, self.transfer.kind, self.weight_sync_s)
            self._report()

    async def _swap(self: PublishingHost, version: int, staged: Path | None, apply: Callable[[], Any]) -> None:
        """Hold new requests, drain the ones in flight, apply the weights, move the version.

        Any failure propagates and the version stays (``_publish`` raises it as ``WeightSyncError``;
        vLLM may hold half-updated weights until ``recover``). ``staged``: the folder the weights
        were written to, if any: from now on what a restarted child boots from.
        """
        self._open.clear()
        try:
            await self._idle.wait()
            if not self.server.alive():
                raise GeneratorUnavailable("the vLLM process is not running", retry_after=self._retry_after())
            client, url = self._require_client(), self.server.url
            paused = False
            try:
                if self.mode == "sync":
                    raise_for_status(await client.post(f"{url}/pause", params={"mode": "wait"}))
                    paused = True
                await apply()
                # Cached prefixes hold keys and values computed with the old weights.
                raise_for_status(await client.post(f"{url}/reset_prefix_cache"))
                raise_for_status(await client.post(f"{url}/update_weight_version", json={"new_version": str(version)}))
            finally:
                if paused and self.server.alive():  # bounded: this also runs when the caller gave up
                    with contextlib.suppress(httpx.HTTPError):
                        await client.post(f"{url}/resume", timeout=_RESUME_TIMEOUT_S)
            self._version = version
            if staged is not None:
                self._serving_folder, self._folder_version = staged, version
                await asyncio.to_thread(prune_weight_folders, self._weights_root, staged)
        finally:
            self._open.set()
