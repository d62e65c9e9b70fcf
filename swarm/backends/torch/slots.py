"""Static-cache decoding: every running row owns a slot of one preallocated KV cache, and on a GPU each
decode step is the replay of a CUDA graph captured once per (rows, columns) bucket.

Why: with a growing cache (``running``) a decode step launches a few hundred small kernels from Python
and copies the cache whenever rows join; on a GPU that overhead, not the model, bounds the speed (an
H100 decoded a 0.5B model at 838 tokens/s that way, and Hugging Face's compiled static-cache generate
at 13.8k). Here the cache never moves while a row runs, so one step's kernels can be recorded once and
replayed with a single launch.

Layout (``SlotPool``): per layer, keys and values of shape ``(slots, kv_heads, length, head_dim)``. The
running rows occupy slots ``0..n-1`` (rows that finish are compacted down, in order). A row's keys sit
in columns ``start..write``: a prefill copies its left-padded block into columns ``0..W-1`` as is (the
keys are already rotated by their real positions), so ``start = W - len(prompt)``, and each decode step
writes the pending token's keys at column ``write`` and attends to ``start..write``. Attention over a
set of columns is order-free once keys are rotated, so the numbers equal the growing cache's up to float
rounding. A step attends only to the first ``width`` columns (the live rows' furthest column, rounded up
to ``COLUMN_BUCKET``), and a batch of n rows runs as the next power of two rows: the padding rows belong
to free slots or to rows just prefilled above the running ones, and only ever write their own pending
column, which the real step overwrites before it is read.

The pool grows (slots and columns, powers of two) when a join needs more, which drops the captured
graphs. It is used for models whose layers all use full attention through ``past_key_values.update``
(Llama, Qwen2, Mistral and most decoder-only models); others keep the growing cache (``supports``).

``compiled`` (opt-in) runs the step through ``torch.compile`` with dynamic shapes before capture, so the
norms, rotary and GQA kernels fuse: every bucket shares one compile because a bucket never has one row
(the smallest is two) and never spans a whole buffer dimension (the columns keep a bucket's margin).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from swarm.backends.torch.attention import reads_sdpa_mask
from swarm.backends.torch.running import RowTable, RunningBatch

logger = logging.getLogger(__name__)

__all__ = ["COLUMN_BUCKET", "SlotBatch", "SlotPool", "supports"]

COLUMN_BUCKET = 128  # attention width is rounded up to this many columns (one graph per width)
P = TypeVar("P", bound=RowTable)


def supports(model: torch.nn.Module) -> bool:
    """True for models whose every layer is full attention reading keys through the cache object."""
    config = model.config
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    sdpa_or_eager = reads_sdpa_mask(config) or getattr(config, "_attn_implementation", None) == "eager"
    return kinds == {"full_attention"} and sdpa_or_eager and hasattr(config, "num_hidden_layers")


def _next_power(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class SlotPool:
    """The preallocated cache, the per-slot column bounds, and the captured decode graphs."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, *, graphs: bool | None = None,
                 compiled: bool = False, slots: int = 8, length: int = 256) -> None:
        self.model, self.vocab_size = model, vocab_size
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        config = model.config
        heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.layers = config.num_hidden_layers
        # Columns are storage, not positions (rotary uses each row's position id): a join left-pads its
        # rows to the widest prompt, so a row may need more columns than the context has positions.
        self.max_length = 2 * int(getattr(config, "max_position_embeddings", 2048))
        self.sdpa = reads_sdpa_mask(config)
        self.top = 0  # slots 0..top-1 may hold live rows
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = self.length = 0
        self._captured: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # torch.compile fuses the step's many small kernels (norms, rotary, GQA) before capture.
        self._step = self._step_eager
        if compiled:
            # Sizes that happen to be equal (rows == slots) must not become a guard: one compile serves all.
            torch.fx.experimental._config.use_duck_shape = False
            self._step = torch.compile(self._step_eager, dynamic=True)
        self._graph_pool: Any = None
        self._allocate(slots, min(length, self.max_length))

    # -- storage ---------------------------------------------------------------------------------

    @torch.inference_mode(False)
    def _allocate(self, slots: int, length: int) -> None:
        """(Re)allocate for ``slots`` x ``length``, keeping what the live slots hold.

        Always as normal tensors, also when a join grows the pool inside the sampler's inference mode:
        an inference tensor is a different input to a compiled step, which would compile it again."""
        shape = (slots, self.kv_heads, length, self.head_dim)
        old = list(zip(self.keys, self.values))
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)]
        for (k, v), nk, nv in zip(old, self.keys, self.values):
            nk[: self.top, :, : self.length].copy_(k[: self.top])
            nv[: self.top, :, : self.length].copy_(v[: self.top])
        state = {name: torch.zeros(slots, dtype=torch.long, device=self.device)
                 for name in ("start", "write", "ids", "positions")}
        if old:
            for name, tensor in state.items():
                tensor[: self.top].copy_(getattr(self, name)[: self.top])
        self.start, self.write, self.ids, self.positions = (state[n] for n in ("start", "write", "ids", "positions"))
        self.columns = torch.arange(length, device=self.device)
        self.slots, self.length = slots, length
        self._captured.clear()

    def reserve(self, slots: int, columns: int) -> None:
        """Room for ``slots`` slots and ``columns`` columns (grows in powers of two)."""
        if columns > self.max_length:
            raise ValueError(f"a row needs {columns} cache columns; at most {self.max_length} fit")
        # A bucket's width stays below the length (a step never attends to a whole buffer dimension,
        # which a compiled step would otherwise treat as a size of its own).
        if slots > self.slots or columns + COLUMN_BUCKET > self.length:
            self._allocate(max(self.slots, _next_power(slots)),
                           min(self.max_length, max(self.length, _next_power(columns + COLUMN_BUCKET))))

    def move(self, source: int, target: int, count: int, columns: int) -> None:
        """Copy ``count`` slots from ``source`` to ``target`` (ranges may overlap), first ``columns`` columns."""
        if source == target or not count:
            return
        for tensor in (*self.keys, *self.values):
            tensor[target:target + count, :, :columns] = tensor[source:source + count, :, :columns].clone()
        for tensor in (self.start, self.write, self.positions, self.ids):
            tensor[target:target + count] = tensor[source:source + count].clone()

    def gather(self, base: int, slots: torch.Tensor, columns: int) -> None:
        """Slots ``base + slots[i]`` become ``base + i`` (``slots`` ascending, on this device); the
        pending ids are set afterwards (``SlotBatch.advance``)."""
        source = slots + base
        for tensor in (*self.keys, *self.values):
            tensor[base:base + len(slots), :, :columns] = tensor[source, :, :columns]
        for tensor in (self.start, self.write, self.positions):
            tensor[base:base + len(slots)] = tensor[source]

    # -- the transformers cache interface (what attention layers call) --------------------------

    def update(self, key: torch.Tensor, value: torch.Tensor, layer: int, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one decode step's keys and values at each row's ``write`` column; return the
        rows' first ``_width`` columns."""
        rows, width = key.shape[0], self._width
        index = (torch.arange(rows, device=key.device), slice(None), self._write_now)
        self.keys[layer][:rows][index] = key[:, :, 0]
        self.values[layer][:rows][index] = value[:, :, 0]
        return self.keys[layer][:rows, :, :width], self.values[layer][:rows, :, :width]

    def get_seq_length(self, layer: int = 0) -> int:
        return self._width

    # -- one decode step -------------------------------------------------------------------------

    def decode(self, rows: int, width: int) -> torch.Tensor:
        """Next-token logits ``(rows, vocab)`` for the pending tokens of slots ``0..rows-1``
        (``rows`` and ``width`` are bucket sizes); a graph replay when graphs are on."""
        if not self.graphs:
            return self._forward(rows, width)
        captured = self._captured.get((rows, width))
        if captured is None:
            try:
                captured = self._capture(rows, width)
            except RuntimeError:  # a model whose forward cannot be captured still decodes, eagerly
                logger.exception("capturing the decode step as a CUDA graph failed: decoding without graphs")
                self.graphs = False
                return self._forward(rows, width)
        captured[0].replay()
        return captured[1]

    def _forward(self, rows: int, width: int) -> torch.Tensor:
        return self._step(self.ids[:rows], self.positions[:rows], self.start[:rows], self.write[:rows],
                          self.columns[:width])

    def _step_eager(self, ids: torch.Tensor, positions: torch.Tensor, start: torch.Tensor, write: torch.Tensor,
                    columns: torch.Tensor) -> torch.Tensor:
        self._width, self._write_now = columns.shape[0], write  # what ``update`` reads
        valid = (columns >= start[:, None]) & (columns <= write[:, None])
        valid[:, 0] |= ~valid.any(dim=-1)  # a padding row with no column would give NaN
        mask = valid[:, None, None, :]
        if not self.sdpa:
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(
                ~mask, torch.finfo(self.dtype).min)
        out = self.model(input_ids=ids[:, None], position_ids=positions[:, None],
                         attention_mask=mask, past_key_values=self, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1, : self.vocab_size].float()

    def _capture(self, rows: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up runs write the same values the replay will
            for _ in range(2):
                self._forward(rows, width)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            logits = self._forward(rows, width)
        self._captured[(rows, width)] = (graph, logits)
        return graph, logits


@dataclass
class SlotBatch(Generic[P]):
    """``RunningBatch``'s interface over a ``SlotPool``: rows at slots ``base..base+len-1``.

    ``pending`` holds the prompts until the first forward (a prefill through a growing cache, copied
    into the slots); after that each forward is one decode step."""

    pool: SlotPool
    base: int
    active: list[int]
    plan: P
    columns: int  # one past the furthest column any row of the batch has written or will write next
    pending: RunningBatch[Any] | None = None
    fresh: bool = False  # just prefilled: the first sampled tokens go to the ``write`` column as set

    @classmethod
    def prefill(cls, pool: SlotPool, prompts: Sequence[Sequence[int]], pad_id: int, active: list[int],
                plan: P) -> SlotBatch[P]:
        width = max(len(p) for p in prompts)
        base = pool.top
        pool.reserve(base + len(prompts), width + 1)
        pool.top = base + len(prompts)
        pending = RunningBatch.prefill(pool.model, prompts, pad_id, active, plan)
        return cls(pool, base, active, plan, width + 1, pending)

    def __len__(self) -> int:
        return len(self.active)

    @property
    def can_merge(self) -> bool:
        return True

    def forward(self, model: torch.nn.Module, vocab_size: int) -> torch.Tensor:
        if self.pending is not None:
            return self._prefill_forward(vocab_size)
        self._relocate(0)
        self.pool.reserve(len(self), self.columns)
        rows = min(max(2, _next_power(len(self))), self.pool.slots)  # 2: a compiled step never sees size 1
        width = min(-(-self.columns // COLUMN_BUCKET) * COLUMN_BUCKET, self.pool.length)
        return self.pool.decode(rows, width)[: len(self)]

    def _prefill_forward(self, vocab_size: int) -> torch.Tensor:
        pending, pool, base = self.pending, self.pool, self.base
        assert pending is not None
        logits = pending.forward(pool.model, vocab_size)
        width, count = pending.mask.shape[-1], len(self)
        for layer, (k, v) in enumerate(zip(pool.keys, pool.values)):
            k[base:base + count, :, :width] = pending.cache.layers[layer].keys
            v[base:base + count, :, :width] = pending.cache.layers[layer].values
        device = pool.device
        pool.start[base:base + count] = (width - pending.mask.sum(-1)).to(device)
        pool.write[base:base + count] = width
        pool.positions[base:base + count] = pending.next_pos.to(device)
        self.pending, self.fresh = None, True
        return logits

    def keep(self, slots: list[int]) -> None:
        """Drop every row not in ``slots`` (ascending), compacting the rest down in order."""
        if len(slots) == len(self.active):
            return
        if slots != list(range(len(slots))):
            index = torch.tensor(slots, dtype=torch.long, device=self.pool.device)
            self.pool.gather(self.base, index, self.columns)
            self.plan = self.plan.select(index)
        else:
            self.plan = self.plan.select(torch.arange(len(slots), device=self.pool.device))
        if self.pool.top == self.base + len(self.active):
            self.pool.top = self.base + len(slots)
        self.active = [self.active[s] for s in slots]

    def release(self) -> None:
        """Every row finished: give the slots back if nothing lies above them."""
        if self.pool.top == self.base + len(self.active):
            self.pool.top = self.base
        self.active = []

    def advance(self, tokens: Sequence[int]) -> None:
        """The sampled ``tokens`` become the pending inputs, one column further on."""
        pool, rows = self.pool, slice(self.base, self.base + len(self))
        pool.ids[rows] = torch.tensor(list(tokens), dtype=torch.long).to(pool.device, non_blocking=True)
        if self.fresh:
            self.fresh = False
            return
        pool.write[rows] += 1
        pool.positions[rows] += 1
        self.columns += 1

    def merge(self, other: SlotBatch[P]) -> None:
        """Append ``other``'s rows, moving their slots right above this batch's."""
        other._relocate(self.base + len(self))
        self.active = self.active + other.active
        self.plan = self.plan.cat(other.plan)
        self.columns = max(self.columns, other.columns)

    def _relocate(self, base: int) -> None:
        if base != self.base:
            self.pool.move(self.base, base, len(self), self.columns)
            self.base = base
            self.pool.top = base + len(self)
