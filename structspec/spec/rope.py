"""Rotary position embeddings by one native call per tensor, bitwise transformers' numbers.

``transformers`` applies rotary embeddings as ``q * cos + rotate_half(q) * sin`` — ten small
operators per attention call whose dispatch cost ~1.3 ms of a ~15 ms one-node pass of the
default model on CPU, and more per row in a tree pass or a prompt. :func:`use_native_rotary`
replaces the modeling module's ``apply_rotary_pos_emb`` with :func:`native_rotary`'s
wrapper, which runs ``structspec/_native/rope.c`` where its inputs are CPU float32 batch-1
states (the decode loops' passes) and the original function otherwise. The kernel rounds
each product and the sum as torch does, so the results are **bitwise** the original's (the
probe at install time checks it, and ``tests/test_rope_native.py``): the replacement is
process-wide — every model of that family sees it — but changes no number anywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from structspec import _native

# The keyword arguments the wrapped function may be given.
_KNOWN = {"unsqueeze_dim", "position_ids"}
# Set on the wrapper: the function it replaced.
_ORIGINAL = "_structspec_original"


def _fits(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether the kernel takes ``x`` ``[1, H, L, D]`` with ``cos``/``sin`` ``[1, L, D]``."""
    return (x.dim() == 4 and x.shape[0] == 1 and x.dtype == torch.float32
            and x.device.type == "cpu" and x.stride(-1) == 1 and x.shape[2] == cos.shape[1]
            and x.shape[3] == cos.shape[2])


def native_rotary(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a ``transformers`` ``apply_rotary_pos_emb``) with CPU float32 batch-1
    calls run by the native kernel."""

    # Looked up once, here: a lookup per call (the native switch's environment read, the
    # CPU check) cost more than the kernel's own call.
    kernel = _native.runnable("rope")

    def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, *args: Any,
                             **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # The rest is the original's: ``unsqueeze_dim`` (and, in older transformers, an
        # unused ``position_ids`` before it); only the default layout runs natively.
        unsqueeze = kwargs.get("unsqueeze_dim", args[-1] if args else 1)
        if (kernel is None or not isinstance(unsqueeze, int) or unsqueeze != 1 or len(args) > 2
                or set(kwargs) - _KNOWN
                or (len(args) == 2 and args[0] is not None)
                or kwargs.get("position_ids") is not None
                or torch.is_grad_enabled() or cos.dim() != 3 or cos.shape[0] != 1
                or cos.dtype != torch.float32 or sin.dtype != torch.float32
                or cos.shape != sin.shape or cos.stride() != sin.stride()
                or cos.stride(-1) != 1 or cos.shape[2] % 2 or not _fits(q, cos)
                or not _fits(k, cos)):
            return original(q, k, cos, sin, *args, **kwargs)
        _, _, rows, d = q.shape
        sc = cos.stride(1)
        outs = []
        for x in (q, k):
            out = torch.empty_like(x)  # the input's strides (a transposed projection's)
            kernel.rotate(x.data_ptr(), x.shape[1], rows, d, x.stride(1), x.stride(2),
                          cos.data_ptr(), sin.data_ptr(), sc, out.data_ptr(), out.stride(1),
                          out.stride(2))
            outs.append(out)
        return outs[0], outs[1]

    setattr(apply_rotary_pos_emb, _ORIGINAL, original)
    apply_rotary_pos_emb.__doc__ = original.__doc__
    return apply_rotary_pos_emb


def _modeling_module(model: Any) -> Any:
    return sys.modules.get(type(model).__module__)


def use_native_rotary(model: Any) -> bool:
    """Replace the ``apply_rotary_pos_emb`` of ``model``'s modeling module with
    :func:`native_rotary`'s wrapper, where the kernel runs here and a probe shows the two
    bitwise equal; returns whether it is in place (idempotent). Any other model is left
    as it is."""
    module = _modeling_module(model)
    current = getattr(module, "apply_rotary_pos_emb", None)
    if current is None or _native.runnable("rope") is None:
        return False
    if getattr(current, _ORIGINAL, None) is not None:
        return True
    wrapped = native_rotary(current)
    if not _bitwise(current, wrapped):
        return False
    module.apply_rotary_pos_emb = wrapped
    return True


def _bitwise(original: Callable[..., Any], wrapped: Callable[..., Any]) -> bool:
    """Whether both give the same bits on probe states laid out as attention passes them."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in (1, 5):
            q = torch.randn(1, rows, 4, 64, generator=gen).transpose(1, 2)
            k = torch.randn(1, rows, 2, 64, generator=gen).transpose(1, 2)
            cos = torch.randn(1, rows, 64, generator=gen)
            sin = torch.randn(1, rows, 64, generator=gen)
            try:
                want, got = original(q, k, cos, sin), wrapped(q, k, cos, sin)
            except (TypeError, RuntimeError, ValueError):
                return False
            if not all(torch.equal(a, b) for a, b in zip(want, got, strict=True)):
                return False
    return True


def restore_rotary(model: Any) -> None:
    """Undo :func:`use_native_rotary` for ``model``'s modeling module."""
    module = _modeling_module(model)
    original = getattr(getattr(module, "apply_rotary_pos_emb", None), _ORIGINAL, None)
    if original is not None:
        module.apply_rotary_pos_emb = original


def native_rotary_active(model: Any) -> bool:
    """Whether ``model``'s modeling module runs :func:`native_rotary`'s wrapper."""
    module = _modeling_module(model)
    return getattr(getattr(module, "apply_rotary_pos_emb", None), _ORIGINAL, None) is not None
