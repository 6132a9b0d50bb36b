"""Grouped-query SDPA for tree passes on CPU, registered with ``transformers``.

A tree pass gives attention a custom 4D mask. ``transformers``' ``sdpa`` path then stops
using SDPA's grouped-query mode (it assumes masked GQA falls back to a slow kernel, true on
CUDA) and copies every key/value head ``num_key_value_groups`` times per layer instead
(``repeat_kv``). On CPU, torch's SDPA takes the mask and the grouped heads together: for the
default model (9 query / 3 key-value heads, 30 layers, 300 cached tokens) tree passes of 2–8
nodes cost 2–9% less (``benchmarks/cost_curve.py``, ``docs/performance.md``); the prompt
(no mask) already runs grouped.

:func:`use_grouped_sdpa` switches a CPU model from ``"sdpa"`` to :data:`IMPLEMENTATION`, an
attention function that does exactly that for masked grouped-query calls and hands every
other call to ``transformers``' own ``sdpa`` function, so plain and speculative decoding run
the same attention. :func:`restore_sdpa` switches back.
"""

from __future__ import annotations

from typing import Any

import torch

#: The name the attention function is registered under (``config._attn_implementation``).
IMPLEMENTATION = "structspec_sdpa"

# Extra arguments that change what attention computes; a call with any of them goes to
# transformers' sdpa function as it is.
_DELEGATED = ("softcap", "position_bias", "s_aux", "sinks")


def grouped_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: torch.Tensor | None,
                         dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``transformers``' ``sdpa`` attention, with grouped-query heads kept grouped when a mask
    is given on CPU. Shapes as ``transformers`` passes them: ``query`` ``[B, Hq, q, D]``,
    ``key``/``value`` ``[B, Hkv, k, D]``; returns ``([B, q, Hq, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.device.type != "cpu" or dropout
            or key.shape[-1] != value.shape[-1] or kwargs.get("output_attentions")
            or any(kwargs.get(name) is not None for name in _DELEGATED)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, grouped_sdpa_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # the masks sdpa gets


def use_grouped_sdpa(model: Any) -> bool:
    """Switch ``model`` from ``"sdpa"`` to :data:`IMPLEMENTATION` (in place) when it runs on
    CPU and has grouped-query attention; returns whether it did. Any other model (another
    attention implementation, a GPU, no key-value groups, a model that cannot switch its
    attention at run time) is left as it is."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    can_switch = getattr(model, "_can_set_attn_implementation", lambda: False)
    if device.type != "cpu" or not heads or heads == kv_heads or not can_switch():
        return False
    _register()
    model.set_attn_implementation(IMPLEMENTATION)
    return getattr(config, "_attn_implementation", None) == IMPLEMENTATION


def restore_sdpa(model: Any) -> None:
    """Undo :func:`use_grouped_sdpa` (no-op on a model it did not switch)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == IMPLEMENTATION:
        model.set_attn_implementation("sdpa")
