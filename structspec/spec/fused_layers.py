"""Fewer, larger calls for a packed model's small layers, with bitwise the same numbers.

A one-token pass of the default model makes ~210 packed linear calls and ~60 norms; on a
CPU each carries a fixed price (dispatch, the activations' rounding, the kernel's set-up)
that a pass of 1–17 rows pays in full. Two of those prices are cut here, for plain and
speculative decoding alike:

- **Fused projections.** Sibling projections that read the same input (an attention
  module's ``q_proj``, ``k_proj`` and ``v_proj``), packed on the same integer kernel, run as
  one packed layer over their concatenated rows: one call, one rounding of the input. A
  column's numbers do not depend on its place among the others (the same property
  :func:`~structspec.spec.fastlinear.gathered_int8` relies on), so each part's output is
  bitwise what its own layer gives; this is checked when the group is built, and a group
  that differs is not fused. The model's own forward is unchanged: the first part called
  computes all of them, the others return their share of that result when called with the
  same input tensor (unchanged since), and compute alone otherwise.
- **Fused norms.** RMSNorm modules of the known ``transformers`` classes run
  ``torch.nn.functional.rms_norm`` (one dispatch instead of seven) where it gives bitwise
  their own output on probe inputs of several row counts; others keep their forward.

Session 45 (the Xeon of ``docs/performance.md``, one thread, 150 cached tokens, interleaved
medians of 30): a one-node pass 25.6 -> 24.3 ms, 9 nodes 30.6 -> 29.2, 17 nodes 37.2 ->
35.7; held-out code requests (64 tokens) 6.2% less time decoding plainly, 4.6% less
speculating. A fixed price cut helps the plain loop's more numerous passes more, so
speculation's ratios fall a little (~1.5%) while every request gets faster.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from structspec.spec.fastlinear import PackedLinear, Unfusable

#: Attention projections fused into one call, in this order.
PROJECTIONS = ("q_proj", "k_proj", "v_proj")
#: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x^2) + eps))`` in float32.
NORM_CLASSES = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm",
                          "Olmo2RMSNorm", "SmolLM3RMSNorm"})
#: Row counts a fused layer is checked at before it is used (1-row steps, trees, prompts).
_PROBE_ROWS = (1, 2, 9, 17, 70)


class FusedGroup:
    """One packed layer computing several sibling layers' outputs at once, and the last
    result, until each part has taken its share. Not a module: the parts hold the weights
    that ``state_dict``, counts and :func:`~structspec.spec.fastlinear.unpack_linears` see."""

    def __init__(self, fused: PackedLinear, sizes: list[int]) -> None:
        self.fused = fused
        self.bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self._input: torch.Tensor | None = None
        self._version = -2
        self._outputs: list[torch.Tensor | None] = []

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Part ``index``'s output for input ``x``: from the last result when it was
        computed from this very tensor, unchanged since and not yet taken by that part;
        otherwise all parts are computed again."""
        version = _version(x)
        if x is not self._input or version != self._version or self._outputs[index] is None:
            out = self.fused(x)  # [..., sum(sizes)]
            b = self.bounds
            self._outputs = [out[..., b[i]:b[i + 1]] for i in range(len(b) - 1)]
            self._input, self._version = x, version
        part = self._outputs[index]
        self._outputs[index] = None
        if all(o is None for o in self._outputs):  # all taken: keep no tensor alive
            self._input = None
        assert part is not None
        return part


def _version(x: torch.Tensor) -> int:
    """``x``'s version counter (bumped by each in-place change); -1 for an inference tensor,
    which has none: there the tensor's identity alone says it is the same input (a model's
    forward hands its projections one hidden state and changes it only after all three)."""
    return -1 if x.is_inference() else x._version


class FusedPart(nn.Module, Unfusable):
    """A packed linear layer that is one part of a :class:`FusedGroup` (inference on CPU
    float32; anything else goes to its own layer)."""

    def __init__(self, own: PackedLinear, group: FusedGroup, index: int) -> None:
        super().__init__()
        self.own = own
        self.group = group
        self.index = index
        self.in_features = own.in_features
        self.out_features = own.out_features

    @property
    def weight(self) -> torch.Tensor:
        """The original (unpacked) weight, for code that inspects it."""
        return self.own.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """The original bias."""
        return self.own.original.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.own(x)
        return self.group.take(self.index, x)

    def unfused(self) -> nn.Module:
        """The original ``nn.Linear`` (for :func:`~structspec.spec.fastlinear.unpack_linears`)."""
        return self.own.original


def _same_bits(parts: list[PackedLinear], group: FusedGroup) -> bool:
    """Whether ``group`` gives each part's own output bit for bit on probe inputs."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in _PROBE_ROWS:
            x = torch.randn(1, rows, parts[0].in_features, generator=gen)
            for i, part in enumerate(parts):
                if not torch.equal(group.take(i, x), part(x)):
                    return False
    return True


def _fuse(parts: list[PackedLinear]) -> FusedGroup | None:
    """A group computing ``parts`` (packed on integer panels, one input width) in one call,
    or None where they cannot be fused with bitwise the same outputs."""
    first = parts[0]
    if any(not p.int8 or p.in_features != first.in_features or p._rounded
           or (p.original.bias is None) != (first.original.bias is None) for p in parts):
        return None
    weights = [p.original.weight.detach() for p in parts]
    if any(w.dtype != torch.float32 or w.device.type != "cpu" for w in weights):
        return None
    joined = nn.Linear(first.in_features, sum(p.out_features for p in parts),
                       bias=first.original.bias is not None)
    with torch.no_grad():
        joined.weight.copy_(torch.cat(weights, 0))
        if joined.bias is not None:
            joined.bias.copy_(torch.cat([p.original.bias.detach() for p in parts], 0))
    fused = PackedLinear(joined, "panel_int8")
    if not fused.int8 or any(fused._signed != p._signed or fused._narrow != p._narrow
                             for p in parts):
        return None
    group = FusedGroup(fused, [p.out_features for p in parts])
    return group if _same_bits(parts, group) else None


def fuse_projections(model: nn.Module) -> int:
    """Fuse every module's :data:`PROJECTIONS` where all are integer-packed
    :class:`~structspec.spec.fastlinear.PackedLinear` layers that fuse with bitwise the same
    outputs. In place, idempotent; returns how many modules were fused."""
    count = 0
    for module in list(model.modules()):
        parts = [getattr(module, name, None) for name in PROJECTIONS]
        if all(isinstance(p, FusedPart) for p in parts):  # fused before
            count += 1
            continue
        if not all(type(p) is PackedLinear for p in parts):
            continue
        group = _fuse(parts)  # type: ignore[arg-type]
        if group is None:
            continue
        for i, (name, part) in enumerate(zip(PROJECTIONS, parts, strict=True)):
            setattr(module, name, FusedPart(part, group, i))  # type: ignore[arg-type]
        count += 1
    return count


def unfuse_projections(model: nn.Module) -> nn.Module:
    """Undo :func:`fuse_projections` (each part's own packed layer back). In place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, FusedPart):
                setattr(parent, name, child.own)
    return model


def _rms_norm(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), module.weight,
                                        module.variance_epsilon)


class _FusedNormForward(Unfusable):
    """The fused forward of one norm module (an instance attribute shadowing its class's)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.own = type(module).forward

    def unfused(self) -> Any:
        """The module, which keeps its own forward once this is deleted."""
        return self.module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.own(self.module, x)
        return _rms_norm(self.module, x)


def _norm_matches(module: nn.Module) -> bool:
    """Whether the fused norm gives ``module``'s own output bit for bit on probe inputs."""
    weight = getattr(module, "weight", None)
    if (type(module).__name__ not in NORM_CLASSES or not isinstance(weight, torch.Tensor)
            or weight.dim() != 1 or weight.dtype != torch.float32
            or weight.device.type != "cpu"
            or not isinstance(getattr(module, "variance_epsilon", None), float)):
        return False
    gen = torch.Generator().manual_seed(0)
    own = type(module).forward
    with torch.inference_mode():
        for rows in _PROBE_ROWS:
            for scale in (1.0, 30.0):
                x = torch.randn(1, rows, weight.shape[0], generator=gen) * scale
                if not torch.equal(_rms_norm(module, x), own(module, x)):
                    return False
    return True


def fuse_norms(model: nn.Module) -> int:
    """Give each RMSNorm of :data:`NORM_CLASSES` torch's fused ``rms_norm`` where it gives
    bitwise the module's own output. In place, idempotent; returns how many norms use it."""
    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), _FusedNormForward):
            count += 1
        elif _norm_matches(module):
            module.forward = _FusedNormForward(module)
            count += 1
    return count


def unfuse_norms(model: nn.Module) -> nn.Module:
    """Undo :func:`fuse_norms`. In place."""
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), _FusedNormForward):
            del module.forward
    return model


def fused_count(model: nn.Module) -> dict[str, int]:
    """How many projection groups and norms of ``model`` run fused (for results and tests)."""
    return {
        "projections": sum(1 for m in model.modules()
                           if isinstance(m, FusedPart) and m.index == 0),
        "norms": sum(1 for m in model.modules()
                     if isinstance(m.__dict__.get("forward"), _FusedNormForward)),
    }


def fuse_layers(model: Any) -> tuple[int, int]:
    """:func:`fuse_projections` and :func:`fuse_norms`; returns both counts."""
    return fuse_projections(model), fuse_norms(model)


def unfuse_layers(model: Any) -> Any:
    """Undo :func:`fuse_layers`. In place; returns ``model``."""
    unfuse_norms(model)
    return unfuse_projections(model)
