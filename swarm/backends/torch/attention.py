"""Decode-step attention that reads grouped key/value heads where they are, instead of repeating them.

Why: with grouped-query attention (SmolLM2: 9 query heads over 3 key/value heads; Qwen2.5-0.5B: 14
over 2) transformers' SDPA path repeats every key and value head ``groups`` times before it attends
whenever a mask is given, and the torch engine always gives one (rows are padded). A decode step then
copies the whole KV cache of every layer: for SmolLM2 at 16 rows x 400 columns on a CPU that copy cost
about as much as the rest of the step. With one query token per row the copy is not needed: the
``groups`` query heads that share a key/value head are simply that head's queries, so SDPA runs on
queries ``(B, kv_heads, groups, D)`` against the cache's own ``(B, kv_heads, W, D)``, and the padding
mask ``(B, 1, 1, W)`` broadcasts over them. The numbers equal the repeated path's up to float rounding.

Every other call (a prefill or training forward with many query tokens, dropout, models without
grouped heads) is transformers' SDPA unchanged, so training and the log-probs it recomputes are
exactly what they were. ``use_grouped_decode`` switches a loaded SDPA model over; ``reads_sdpa_mask``
is how the rest of the engine asks whether a model takes SDPA's boolean masks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["GROUPED_SDPA", "grouped_decode_attention", "reads_sdpa_mask", "use_grouped_decode"]

GROUPED_SDPA = "grouped_sdpa"  # contains "sdpa": transformers checks SDPA support for it as for SDPA


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` ``(B, H, Q, D)``, ``key``/``value`` ``(B, KV, W, D)``;
    returns ``(B, Q, H, D)``. One query token per row with grouped heads attends in place; all else is SDPA."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    if query.shape[2] != 1 or groups == 1 or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    rows, heads, _, dim = query.shape
    # Query head h reads key/value head h // groups (transformers' repeat_kv order), so the heads of one
    # group are consecutive: a view, no copy.
    grouped = query.reshape(rows, key.shape[1], groups, dim)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(rows, 1, heads, dim), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_decode_attention)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # masks are built exactly as for SDPA


def use_grouped_decode(model: Any) -> bool:
    """Switch an SDPA model with grouped heads to ``grouped_decode_attention``; True if it was switched."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv_heads >= heads:
        return False
    _register()
    model.set_attn_implementation(GROUPED_SDPA)
    return True


def reads_sdpa_mask(config: Any) -> bool:
    """True if the model attends through SDPA (plain or grouped), which takes ready boolean masks."""
    return getattr(config, "_attn_implementation", None) in ("sdpa", GROUPED_SDPA)
