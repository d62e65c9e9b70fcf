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
(or ``load_streamed``, when the trainer streams its own weights over NCCL) holds new requests back,
lets the ones in flight finish on the old weights (they keep the old tag), then applies the weights
through its ``transfer`` (``transfer``: a folder reloaded in place, or NCCL), bumps the version and
lets the waiting requests go. In ``sync`` mode that is additionally wrapped in vLLM's
``/pause?mode=wait`` and ``/resume`` (vLLM itself then schedules nothing else, e.g. requests of
other users of an attached server).

Failures: when the child dies, requests fail with ``GeneratorUnavailable(retry_after)`` and a
watchdog restarts the child on the latest weights folder (and tags what it serves with that
folder's version). A publication that fails in any way raises ``WeightSyncError`` (vLLM may hold
half-updated weights); a caller that gives up waiting cancels it. Either way the caller, the step
loop, then calls ``recover(version, weights)``: the weights are written to a folder and vLLM is
restarted on them (an attached server reloads them), serving that version.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from swarm.backends.base import Generation, Generator, Sampled, SamplingParams, TokenSink
from swarm.backends.sampling_params import validate_requests
from swarm.backends.vllm.chat import ChatTokenizer
from swarm.backends.vllm.completions import completion_body, request_row
from swarm.backends.vllm.errors import GeneratorUnavailable, VllmStartError
from swarm.backends.vllm.process import START_TIMEOUT_S, AttachedVllm, VllmProcess
from swarm.backends.vllm.publishing import WeightPublishing
from swarm.text.templates import ChatText
from swarm.weights.folder import reload_from_folder
from swarm.weights.transfer import DiskTransfer, WeightTransfer

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
    weight_transfer: str = "disk"
    weight_transfer_reason: str = ""
    gpus: str = ""  # the child's CUDA devices (empty: CPU, or not ours to know)


class VllmGenerator(WeightPublishing, Generator):
    """The ``Generator`` protocol on a vLLM server (see the module docstring)."""

    reports_top_logprobs = True
    restarts_on_recover = True  # ``recover`` restarts the vLLM child on the weights

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
        start_timeout: float = START_TIMEOUT_S,
        request_timeout: float = 600.0,
        transfer: WeightTransfer | None = None,
        transfer_reason: str = "",
        weights_dtype: str | None = None,
        on_status: Callable[[VllmStatus], None] | None = None,
    ) -> None:
        """``transfer``: how published weights reach vLLM (default: a folder reloaded in place);
        ``transfer_reason``: why it was chosen (shown in the status). ``weights_dtype``: the dtype
        weight folders are written in ("bfloat16" on GPU; None keeps the trainer's)."""
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
        self.text = ChatText(self.chat.tokenizer)
        limit = getattr(server, "max_model_len", None) or self.chat.max_position_embeddings
        self.max_context = min(max_context or limit, limit)
        self.eos_token_id = self.chat.eos_token_id
        self.on_status = on_status  # called on every health or version change
        self._version = policy_version  # the version of the weights in model_dir
        self._serving_folder = self.model_dir  # what a restarted child boots from
        self._folder_version = policy_version  # the version of the weights in _serving_folder
        self._weights_root = self.state_dir / "vllm-weights"
        self.weights_dtype = weights_dtype
        self.transfer: WeightTransfer = transfer or DiskTransfer(self.model_dir, self._weights_root,
                                                                dtype=weights_dtype, timeout=request_timeout)
        self.transfer_reason = transfer_reason or "default"
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
        enforce_eager: bool | None = None,
        gpus: Sequence[str] = (),
        gpu_memory_utilization: float | None = None,
        **kwargs: Any,
    ) -> VllmGenerator:
        """A generator owning a vLLM child on ``model_dir`` (log in ``state_dir/vllm.log``); call ``start``.

        ``gpus``: the child's physical GPU ids (empty: vLLM's CPU build; see ``VllmProcess``)."""
        chat_limit = ChatTokenizer.load(model_dir).max_position_embeddings
        transfer = kwargs.get("transfer")
        nccl = transfer is not None and transfer.kind == "nccl"
        process = VllmProcess(
            model_dir, Path(state_dir) / "vllm.log", python=python,
            max_model_len=min(max_model_len or chat_limit, chat_limit), enforce_eager=enforce_eager,
            gpus=gpus, gpu_memory_utilization=gpu_memory_utilization,
            extra_args=("--weight-transfer-config", '{"backend": "nccl"}') if nccl else (),
        )
        kwargs.setdefault("weights_dtype", "bfloat16" if gpus else None)
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

    def describe(self) -> dict[str, object]:
        return {"engine": "vllm", **asdict(self.status())}

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
        self.transfer.reset()
        await self.server.stop()
        if self._client is not None:
            await self._client.aclose()

    async def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
                       sink: TokenSink | None = None, *, affinity: str | None = None) -> Sampled:
        """``affinity`` changes nothing: vLLM's own prefix cache serves every call of this engine."""
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

    # -- status and recovery ---------------------------------------------------------------------

    def status(self) -> VllmStatus:
        return VllmStatus(
            url=self._url_or_none() or "", owned=self.server.owned, alive=self.server.alive(),
            restarting=self._restarting is not None and not self._restarting.done(), restarts=self.restarts,
            start_time_s=self.server.start_time_s, policy_version=self._version,
            weight_sync_s=self.weight_sync_s, last_error=self.last_error, weight_transfer=self.transfer.kind,
            weight_transfer_reason=self.transfer_reason, gpus=",".join(getattr(self.server, "gpus", ())),
        )

    async def restart(self) -> None:
        """Restart the child on the latest weights folder, tagged with that folder's version (on the
        NCCL path that may be older than the last version streamed: the lag shows)."""
        async with self._update_lock:
            await self._restart_locked()

    async def _restart_locked(self) -> None:
        self._open.clear()
        try:
            await self._idle.wait()  # requests in flight fail fast against a dead child
            await self.server.stop()
            self.transfer.reset()  # an NCCL group dies with the child
            self._version = self._folder_version
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

    async def _reload(self, folder: Path) -> None:
        await reload_from_folder(self._require_client(), self.server.url, folder, timeout=self.request_timeout)

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("start() the generator first")
        return self._client
