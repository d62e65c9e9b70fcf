"""``VllmGenerator``: the ``Generator`` contract served by a vLLM OpenAI server, token ids in and out.

Prompts are rendered here (``chat.ChatTokenizer``) and sent to ``POST /v1/completions`` as token ids,
one HTTP request per row (vLLM batches concurrent requests itself). The answer's ``token_ids`` and
per-token log-probs are recorded as they are; generated text is never re-tokenised.

Log-prob semantics (the contract in ``swarm.backends.base.Generation``): the child runs with
``--logprobs-mode processed_logprobs``, i.e. ``log_softmax(logits / T)`` after vLLM's sampling
processors; greedy rows get ``T = 1``. Two details make that equal to what the trainer recomputes:
ids the tokenizer cannot decode (embedding padding) get a -100 logit bias, as the torch engine cuts
them from its logits; and with ``top_p < 1`` vLLM masks the tail *before* the log-softmax, so such
rows get log-probs renormalised over the nucleus (vLLM offers no mode with temperature but without
top-p; rows with ``top_p = 1``, the RL default, are exact).

Versions: every ``Sampled`` carries the version of the weights that served it. ``load_weights``
holds new requests back, lets the ones in flight finish on the old weights (they keep the old tag),
then swaps the weights (``weights``), bumps the version and lets the waiting requests go. In
``sync`` mode the swap is additionally wrapped in vLLM's ``/pause?mode=wait`` and ``/resume`` (vLLM
itself then schedules nothing else, e.g. requests of other users of an attached server).

Failures: when the child dies, requests fail with ``GeneratorUnavailable(retry_after)`` and a
watchdog restarts the child on the latest weights folder, serving the latest version again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from swarm.backends.base import Generation, Sampled, SamplingParams, TokenSink, Weights
from swarm.backends.text import validate_requests
from swarm.backends.vllm.chat import ChatTokenizer
from swarm.backends.vllm.completions import completion_body, raise_for_status, request_row
from swarm.backends.vllm.errors import GeneratorUnavailable, VllmStartError
from swarm.backends.vllm.process import AttachedVllm, VllmProcess
from swarm.backends.vllm.weights import (
    NcclWeightSender,
    pick_transfer,
    prune_weight_folders,
    reload_from_folder,
    write_weights_folder,
)

logger = logging.getLogger(__name__)

__all__ = ["VllmGenerator", "VllmStatus"]

SyncMode = Literal["sync", "async"]


@dataclass
class VllmStatus:
    """What the server reports about its vLLM child."""

    url: str
    owned: bool
    alive: bool
    restarting: bool
    restarts: int
    start_time_s: float
    policy_version: int
    weight_sync_s: float = 0.0
    last_error: str | None = None


class VllmGenerator:
    """The ``Generator`` protocol on a vLLM server (see the module docstring)."""

    reports_top_logprobs = True

    def __init__(
        self,
        server: VllmProcess | AttachedVllm,
        model_dir: str | Path,
        state_dir: str | Path,
        *,
        model_name: str | None = None,
        policy_version: int = 0,
        mode: SyncMode = "sync",
        max_context: int | None = None,
        start_timeout: float = 180.0,
        request_timeout: float = 600.0,
        weight_transfer: Literal["auto", "disk", "nccl"] = "auto",
        on_status: Callable[[VllmStatus], None] | None = None,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        self.server = server
        self.model_dir = Path(model_dir)
        self.state_dir = Path(state_dir)
        self.model_name = model_name or self.model_dir.resolve().name
        self.mode = mode
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.chat = ChatTokenizer.load(self.model_dir)
        limit = getattr(server, "max_model_len", None) or self.chat.max_position_embeddings
        self.max_context = min(max_context or limit, limit)
        self.eos_token_id = self.chat.eos_token_id
        self.on_status = on_status  # called on every health or version change
        self._transfer = pick_transfer(weight_transfer)
        self._nccl: NcclWeightSender | None = None
        self._version = policy_version  # the version of the weights in model_dir
        self._serving_folder = self.model_dir  # what a restarted child boots from
        self._weights_root = self.state_dir / "vllm-weights"
        self._padding_ids = range(self.chat.vocab_size, self.chat.model_vocab_size)
        self._client: httpx.AsyncClient | None = None
        self._open = asyncio.Event()  # cleared while weights are swapped or the child restarts
        self._open.set()
        self._idle = asyncio.Event()  # set when no request is in flight
        self._idle.set()
        self._inflight = 0
        self._update_lock = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._closed = False
        self._failed_restarts = 0
        self.restarts = 0
        self.weight_sync_s = 0.0
        self.last_error: str | None = None

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def launch(
        cls,
        model_dir: str | Path,
        state_dir: str | Path,
        *,
        python: str | Path | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        **kwargs: Any,
    ) -> VllmGenerator:
        """A generator owning a vLLM child on ``model_dir`` (log in ``state_dir/vllm.log``); call ``start``."""
        chat_limit = ChatTokenizer.load(model_dir).max_position_embeddings
        nccl = pick_transfer(kwargs.get("weight_transfer", "auto")) == "nccl"
        process = VllmProcess(
            model_dir, Path(state_dir) / "vllm.log", python=python,
            max_model_len=min(max_model_len or chat_limit, chat_limit), enforce_eager=enforce_eager,
            dtype="auto" if nccl else "float32",
            extra_args=("--weight-transfer-config", json.dumps({"backend": "nccl"})) if nccl else (),
        )
        return cls(process, model_dir, state_dir, **kwargs)

    @classmethod
    def attach(cls, url: str, model_dir: str | Path, state_dir: str | Path, **kwargs: Any) -> VllmGenerator:
        """A generator on a vLLM server someone else runs at ``url`` serving ``model_dir``."""
        return cls(AttachedVllm(url), model_dir, state_dir, **kwargs)

    # -- the Generator protocol ------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def available(self) -> bool:
        """False while the child is restarting or dead (chat calls get a 503 then)."""
        restarting = self._restarting is not None and not self._restarting.done()
        return not self._closed and not restarting and self.server.alive()

    @property
    def updating(self) -> bool:
        """True while a weight swap or a restart holds new requests back."""
        return not self._open.is_set()

    def describe(self) -> dict[str, Any]:
        return {"engine": "vllm", **asdict(self.status())}

    def render_prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> list[int]:
        return self.chat.render_prompt(messages, tools)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.chat.decode(token_ids)

    def encode(self, text: str) -> list[int]:
        return self.chat.encode(text)

    async def start(self) -> None:
        """Start (or reach) vLLM and the watchdog; ``VllmStartError`` if it does not come up in time."""
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout, connect=10.0),
                                         limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))
        try:
            await self.server.start(self._serving_folder, timeout=self.start_timeout)
        except BaseException:
            await self._client.aclose()
            raise
        self._watchdog = asyncio.create_task(self._watch(), name="vllm-watchdog")
        self._report()

    async def close(self) -> None:
        self._closed = True
        for task in (self._watchdog, self._restarting):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._nccl is not None:
            await asyncio.to_thread(self._nccl.close)
        await self.server.stop()
        if self._client is not None:
            await self._client.aclose()

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None) -> Sampled:
        validate_requests(prompts, params, max_context=self.max_context, vocab_size=self.chat.vocab_size)
        await self._admit()
        version = self._version
        self._inflight += 1
        self._idle.clear()
        tasks = [asyncio.ensure_future(self._generate_row(i, prompt, p, sink))
                 for i, (prompt, p) in enumerate(zip(prompts, params))]
        try:
            rows = await asyncio.gather(*tasks)
        except BaseException:
            # One row failed or the caller went away: stop the others (closing their connections
            # makes vLLM abort them) before the in-flight count drops.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
        return Sampled(generations=list(rows), policy_version=version)

    async def load_weights(self, version: int, weights: Weights) -> None:
        """Serve ``weights`` as ``version``: requests in flight finish on the old weights first.

        ``GeneratorUnavailable`` if vLLM is down: the weights are adopted anyway (the restarted
        child boots from them). ``RuntimeError`` if vLLM refuses them (e.g. names that do not fit
        the model); the previous version keeps serving after a restart.
        """
        async with self._update_lock:
            started = time.monotonic()
            # Written in both modes, while requests still run: it is what a restarted child boots from.
            folder = await asyncio.to_thread(write_weights_folder, weights, self.model_dir, self._weights_root, version)
            if self._transfer == "nccl":
                await self._swap(version, folder, lambda: asyncio.to_thread(self._nccl_sender().send, weights))
            else:
                await self._swap(version, folder, lambda: self._reload(folder))
            self.weight_sync_s = time.monotonic() - started
            logger.info("vLLM serves policy version %d (sync %.2f s)", version, self.weight_sync_s)
            self._report()

    # -- status and recovery ---------------------------------------------------------------------

    def status(self) -> VllmStatus:
        return VllmStatus(
            url=self._url_or_none() or "", owned=self.server.owned, alive=self.server.alive(),
            restarting=self._restarting is not None and not self._restarting.done(), restarts=self.restarts,
            start_time_s=self.server.start_time_s, policy_version=self._version,
            weight_sync_s=self.weight_sync_s, last_error=self.last_error,
        )

    async def restart(self) -> None:
        """Restart the child on the latest weights (the version tag stays the latest loaded one)."""
        async with self._update_lock:
            self._open.clear()
            try:
                await self._idle.wait()  # requests in flight fail fast against a dead child
                await self.server.stop()
                if self._nccl is not None:  # its NCCL group died with the child
                    await asyncio.to_thread(self._nccl.close)
                    self._nccl = None
                if self.server.owned:
                    await self.server.start(self._serving_folder, timeout=self.start_timeout)
                else:
                    await self.server.start(timeout=self.start_timeout)
                    if self._serving_folder != self.model_dir:
                        await self._reload(self._serving_folder)
                self.restarts += 1
                self.last_error = None
                logger.info("vLLM restarted (%d) on %s, version %d", self.restarts, self._serving_folder, self._version)
            finally:
                self._open.set()
                self._report()

    # -- internals -------------------------------------------------------------------------------

    def _url_or_none(self) -> str | None:
        try:
            return self.server.url
        except RuntimeError:
            return None

    def _report(self) -> None:
        if self.on_status is not None:
            self.on_status(self.status())

    def _retry_after(self) -> float:
        return max(1.0, self.server.start_time_s or 30.0)

    async def _admit(self) -> None:
        if self._closed:
            raise GeneratorUnavailable("the vLLM generator is closed", retry_after=0)
        if self._restarting is not None and not self._restarting.done():
            raise GeneratorUnavailable("vLLM is restarting", retry_after=self._retry_after())
        if not self.server.alive():
            self._begin_restart("the vLLM process is not running")
            raise GeneratorUnavailable("vLLM is not running; restarting it", retry_after=self._retry_after())
        # Re-check after waking: another update may have closed the gate again before this task ran.
        # No await between the last check and the caller's in-flight count, so an update cannot slip in.
        while not self._open.is_set():
            await self._open.wait()

    def _begin_restart(self, reason: str) -> None:
        if self._closed:
            return
        if self._restarting is None or self._restarting.done():
            self.last_error = reason
            logger.warning("%s; restarting vLLM on %s", reason, self._serving_folder)
            self._restarting = asyncio.create_task(self._restart_logged(), name="vllm-restart")
            self._report()

    async def _restart_logged(self) -> None:
        try:
            await self.restart()
            self._failed_restarts = 0
        except (VllmStartError, OSError) as exc:
            self._failed_restarts += 1
            self.last_error = f"restart failed: {exc}"
            logger.error("vLLM restart %d failed: %s", self._failed_restarts, exc)
            self._report()
            await asyncio.sleep(min(60.0, 5.0 * self._failed_restarts))  # back off before the next try

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(1.0)
            if self.server.owned and not self.server.alive() and not self._update_lock.locked():
                self._begin_restart("the vLLM process died")

    async def _generate_row(self, index: int, prompt: Sequence[int], p: SamplingParams,
                            sink: TokenSink | None) -> Generation:
        body = completion_body(prompt, p, stream=sink is not None, eos_ids=sorted(self.chat.eos_ids),
                               padding_ids=self._padding_ids)
        try:
            return await request_row(self._require_client(), f"{self.server.url}/v1/completions", body, p,
                                     self.chat.decode, index, sink)
        except httpx.TransportError as exc:
            if not self.server.owned or not self.server.alive():  # a slow but live child is left alone
                self._begin_restart(f"vLLM unreachable: {exc!r}")
            raise GeneratorUnavailable(f"vLLM request failed: {exc!r}", retry_after=self._retry_after()) from exc

    async def _swap(self, version: int, folder: Path, apply: Callable[[], Any]) -> None:
        """Hold new requests, drain the ones in flight, apply the weights, move the version.

        If the child is dead or dies meanwhile, the version still moves: the restart boots from
        ``folder``, so whatever serves next serves these weights. If vLLM refuses the weights, its
        parameters may be half-updated: it is restarted on the previous folder and version.
        """
        previous = self._serving_folder
        self._open.clear()
        try:
            await self._idle.wait()
            self._serving_folder = folder
            client = self._require_client()
            paused = False
            try:
                if not self.server.alive():
                    raise httpx.ConnectError("the vLLM process is not running")
                if self.mode == "sync":
                    raise_for_status(await client.post(f"{self.server.url}/pause", params={"mode": "wait"}))
                    paused = True
                await apply()
                # Cached prefixes hold keys and values computed with the old weights.
                raise_for_status(await client.post(f"{self.server.url}/reset_prefix_cache"))
                raise_for_status(await client.post(f"{self.server.url}/update_weight_version",
                                                    json={"new_version": str(version)}))
            except httpx.TransportError as exc:
                self._version = version
                self._begin_restart(f"weight update failed: {exc!r}")  # runs once we release the lock
                raise GeneratorUnavailable("vLLM failed during a weight update; restarting it",
                                           retry_after=self._retry_after()) from exc
            except (httpx.HTTPStatusError, GeneratorUnavailable, ValueError) as exc:
                self._serving_folder = previous
                self._begin_restart(f"vLLM refused the weights of version {version}: {exc}")
                raise RuntimeError(f"vLLM refused the weights of version {version}: {exc}") from exc
            finally:
                if paused and self.server.alive():
                    try:
                        await client.post(f"{self.server.url}/resume")
                    except httpx.TransportError:
                        pass
            self._version = version
            await asyncio.to_thread(prune_weight_folders, self._weights_root, folder)
        finally:
            self._open.set()

    async def _reload(self, folder: Path) -> None:
        await reload_from_folder(self._require_client(), self.server.url, folder, timeout=self.request_timeout)

    def _nccl_sender(self) -> NcclWeightSender:
        if self._nccl is None:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            self._nccl = NcclWeightSender(self.server.url, master_port=port)
        return self._nccl

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("start() the generator first")
        return self._client
