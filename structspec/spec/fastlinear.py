"""Packed oneDNN linears: make forward passes of a few rows cheap on CPU.

A draft tree is a pass of 2–32 rows. On CPU, MKL's SGEMM re-reads each weight matrix per
few rows, so a 8-row pass of the default model costs ~2.3× a 1-row pass instead of the
~1.3–1.5× arithmetic allows. Packing each ``nn.Linear`` weight once into oneDNN's blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``) and calling
``torch.ops.mkldnn._linear_pointwise`` measured (DESIGN.md, AMD Zen 3, 350-token prefix):
t(2) 1.15×, t(8) 1.52×, t(32) 2.19× of t(1), and t(1) itself ~25% faster, with logits
within 1e-4 of the unpacked model.

:func:`pack_linears` swaps modules in place and keeps the originals, so
:func:`unpack_linears` restores the model exactly. Packed weights are an extra copy of every
linear weight (≈ the model's size again). Inference only (no autograd through the packed op).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def packing_available(model: Any | None = None) -> bool:
    """Whether :func:`pack_linears` can pack ``model`` (ops present, CPU, float32)."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        has_ops = (ops is not None and hasattr(ops, "_reorder_linear_weight")
                   and hasattr(ops, "_linear_pointwise") and torch.backends.mkldnn.is_available())
    except (AttributeError, RuntimeError):  # pragma: no cover - exotic builds
        has_ops = False
    if not has_ops or model is None:
        return has_ops
    try:
        param = next(model.parameters())
    except StopIteration:
        return False
    return param.device.type == "cpu" and param.dtype == torch.float32


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is packed once for oneDNN. Inference only.

    Attributes:
        original: the replaced ``nn.Linear`` (kept for :func:`unpack_linears`).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.original = linear
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            weight = linear.weight.detach().contiguous()
            # Plain attributes, not buffers: state_dict and .to() keep seeing the original.
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            self._bias = None if linear.bias is None else linear.bias.detach().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The original (unpacked) weight, for code that inspects it."""
        return self.original.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.original(x)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self._bias,
                                                  "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (``lm_head`` included) by a
    :class:`PackedLinear`, in place; returns ``model``.

    Does nothing (and returns ``model`` unchanged) when packing is unavailable: the oneDNN ops
    are missing, or the model is not float32 on CPU. Idempotent. Mutates ``model``; not
    thread-safe against concurrent forwards. The originals stay registered (as
    ``<name>.original``), so parameters and ``model.device`` are unchanged but ``state_dict``
    keys are not: call :func:`unpack_linears` before saving. Calls run under ``torch.no_grad`` or
    ``inference_mode`` use the packed path; with autograd enabled each layer falls back to its
    original ``nn.Linear``.
    """
    if not packing_available(model):
        return model
    for parent in list(model.modules()):
        if isinstance(parent, PackedLinear):
            continue
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
    return model


def unpack_linears(model: nn.Module) -> nn.Module:
    """Undo :func:`pack_linears`: put the original ``nn.Linear`` modules back. In place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.original)
    return model


def is_packed(model: nn.Module) -> bool:
    """Whether any linear of ``model`` is packed."""
    return any(isinstance(m, PackedLinear) for m in model.modules())
