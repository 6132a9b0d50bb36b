"""Attention for CPU passes, registered with ``transformers``: the same numbers for a row in
every pass, and grouped-query heads kept grouped under tree masks.

**Row-exact attention.** Speculation is lossless only if a tree pass gives each row the
numbers a 1-row pass gives it. The packed linear layers do; torch's SDPA does not (it sums
over keys in vector lanes chosen by each key's position, and a tree pass puts a row's
ancestors at other positions than the sequential cache: tree and sequential logits of the
default model differed by ~4e-5). Where the native kernel ``attend``
(``structspec/_native/attend.c``) runs — a CPU with AVX2 and FMA, float32, batch 1 — every
attention call of the model goes to it: scores, softmax and the weighted sum run in key
order and a masked key adds exactly nothing, so a row's attention output is **bitwise** the
same in a tree pass, a prefill and a 1-row step, and plain and speculative decoding see
identical numbers end to end. Other calls (a GPU, batches, other dtypes, masks with values
other than 0 and "masked") go to SDPA as below.

**Grouped-query SDPA.** A tree pass gives attention a custom 4D mask. ``transformers``'
``sdpa`` path then stops using SDPA's grouped-query mode (it assumes masked GQA falls back
to a slow kernel, true on CUDA) and copies every key/value head ``num_key_value_groups``
times per layer instead (``repeat_kv``). On CPU, torch's SDPA takes the mask and the grouped
heads together: for the default model (9 query / 3 key-value heads, 30 layers, 300 cached
tokens) tree passes of 2–8 nodes cost 2–9% less (``benchmarks/cost_curve.py``,
``docs/performance.md``); the prompt (no mask) already runs grouped.

:func:`use_grouped_sdpa` switches a CPU model from ``"sdpa"`` to :data:`IMPLEMENTATION`, an
attention function that does the above and hands every other call to ``transformers``' own
``sdpa`` function, so plain and speculative decoding run the same attention.
:func:`restore_sdpa` switches back.
"""

from __future__ import annotations

from typing import Any

import torch

from structspec import _native

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

    if not dropout and not any(kwargs.get(name) is not None for name in _DELEGATED) \
            and not kwargs.get("output_attentions"):
        exact = row_exact_attention(module, query, key, value, attention_mask, scaling,
                                    is_causal)
        if exact is not None:
            return exact, None
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.device.type != "cpu" or dropout
            or key.shape[-1] != value.shape[-1] or kwargs.get("output_attentions")
            or any(kwargs.get(name) is not None for name in _DELEGATED)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


# The kernel's mask kinds (attend.c).
_NONE, _CAUSAL, _FLOAT, _BOOL = 0, 1, 2, 3
# Whether row_exact_attention runs (set_row_exact: for A/B runs and tests).
_ROW_EXACT = [True]


def _exact_kernel() -> Any:
    """The native ``attend`` module where it is built and runs on this CPU, else None;
    looked up once per process where found (every attention call asks: the native switch's
    environment read and the CPU check cost ~3 us a call)."""
    if _FOUND:
        return _FOUND[0]
    kernel = _native.runnable("attend")
    if kernel is not None:
        _FOUND.append(kernel)
    return kernel


_FOUND: list[Any] = []


def set_row_exact(on: bool) -> bool:
    """Let :func:`row_exact_attention` run (where it applies) or send every call to SDPA, as
    before it existed; returns the previous setting. Process-wide: for A/B measurements and
    tests, not for decoding (with it off, speculative and plain decoding may differ by
    near-ties)."""
    before = _ROW_EXACT[0]
    _ROW_EXACT[0] = bool(on)
    return before


def row_exact_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        scaling: float | None = None,
                        is_causal: bool | None = None) -> torch.Tensor | None:
    """Attention by the native ``attend`` kernel (see the module docstring): ``[1, q, Hq, D]``,
    or ``None`` where it does not apply (kernel not built or switched off, not CPU float32,
    batch > 1, autograd, a head size not a multiple of 8 or over 256, a mask of another
    shape or dtype). Shapes as ``transformers`` passes them: ``query`` ``[1, Hq, q, D]``,
    ``key``/``value`` ``[1, Hkv, k, D]``, ``attention_mask`` ``[1, 1, q, >= k]`` (additive
    float: a key is masked where below -1e30; or bool: True where visible) or None."""
    kernel = _exact_kernel() if _ROW_EXACT[0] else None
    if kernel is None:
        return None
    if (query.device.type != "cpu" or query.dim() != 4 or query.shape[0] != 1
            or torch.is_grad_enabled()
            or any(t.dtype != torch.float32 for t in (query, key, value))):
        return None
    _, hq, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    if (d % 8 or d > 256 or value.shape[-1] != d or key.shape[-1] != d or hq % hkv
            or value.shape[1] != hkv or value.shape[2] != lk or lk == 0):
        return None
    mask = None
    if attention_mask is None:
        if is_causal is None:
            is_causal = lq > 1 and getattr(module, "is_causal", True)
        kind = _CAUSAL if is_causal and lq > 1 else _NONE
        if kind == _CAUSAL and lq > lk:
            return None
    else:
        if (attention_mask.dim() != 4 or attention_mask.shape[0] != 1
                or attention_mask.shape[1] != 1 or attention_mask.shape[2] != lq
                or attention_mask.shape[3] < lk):
            return None
        mask = attention_mask[0, 0]  # [q, >= lk]: rows read in place (ldm), not copied
        ldm = mask.stride(0) if lq > 1 else mask.shape[1]  # (one row's stride is arbitrary)
        if mask.stride(-1) != 1 or ldm < lk:
            mask, ldm = mask[:, :lk].contiguous(), lk
        if mask.dtype == torch.bool:
            kind, mask = _BOOL, mask.view(torch.uint8)
        elif mask.dtype == torch.float32:
            kind = _FLOAT
        else:
            return None
    scale = scaling if scaling is not None else d ** -0.5
    q = query[0]  # [Hq, q, D], read in place where its rows are (the projections' layout)
    sqh = q.stride(0) if hq > 1 else lq * d  # (a size-1 dimension's stride is arbitrary)
    sqr = q.stride(1) if lq > 1 else d
    if q.stride(-1) != 1 or sqh < d or sqr < d:  # not rows of d floats each
        q, sqh, sqr = q.contiguous(), lq * d, d
    (k, skh), (v, svh) = _heads(key[0]), _heads(value[0])
    out = torch.empty(1, lq, hq, d, dtype=torch.float32)
    kernel.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), hq, hkv, lq, lk, d,
                  0 if mask is None else mask.data_ptr(), kind, float(scale), out.data_ptr(),
                  torch.get_num_threads(), lk if mask is None else ldm, sqh, sqr, skh, svh)
    return out


def _heads(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``t`` ``[H, L, D]`` as the kernel reads it — each head's rows of ``D`` floats back to
    back, heads ``stride`` floats apart — with that stride: in place where it is laid out so
    (a contiguous tensor, or a cache with room to grow: :mod:`structspec.spec.kv_cache`),
    else a contiguous copy."""
    h, length, d = t.shape
    if t.stride(-1) == 1 and (length == 1 or t.stride(1) == d) \
            and (h == 1 or t.stride(0) >= length * d):
        return t, (t.stride(0) if h > 1 else length * d)
    return t.contiguous(), length * d


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, grouped_sdpa_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # the masks sdpa gets


def use_grouped_sdpa(model: Any) -> bool:
    """Switch ``model`` from ``"sdpa"`` to :data:`IMPLEMENTATION` (in place) when it runs on
    CPU and has grouped-query attention or the row-exact kernel runs here; returns whether it
    did. Any other model (another attention implementation, a GPU, no key-value groups and no
    kernel, a model that cannot switch its attention at run time) is left as it is."""
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
    exact = _exact_kernel() is not None
    if device.type != "cpu" or not heads or (heads == kv_heads and not exact) \
            or not can_switch():
        return False
    _register()
    model.set_attn_implementation(IMPLEMENTATION)
    return getattr(config, "_attn_implementation", None) == IMPLEMENTATION


def restore_sdpa(model: Any) -> None:
    """Undo :func:`use_grouped_sdpa` (no-op on a model it did not switch)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == IMPLEMENTATION:
        model.set_attn_implementation("sdpa")
