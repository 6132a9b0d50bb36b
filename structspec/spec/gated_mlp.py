"""The gated MLP's activation as one native operator on CPU passes.

Llama-family MLPs compute ``down(silu(gate(x)) * up(x))``; torch runs the activation as two
operators over the whole tensor, which grow with a pass's rows (~0.3 ms more for a 12-node
tree pass than a one-node one, ~1.5 ms for a prompt's pass). :func:`use_fused_activation`
gives each such MLP a forward that runs ``silu(g) * u`` in place in one vectorised loop
(``structspec/_native/gated.c``): **bitwise** torch's numbers (Sleef's ``expf`` operation
for operation), element by element the same in any pass, so outputs do not move and
speculation stays lossless. An MLP class whose own forward does not give the fused
forward's bits on a probe input (another activation, another layout, a torch whose ``silu``
rounds otherwise) is left as it is.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from structspec import _native

# The MLP classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; the
# probe in use_fused_activation checks it anyway.
_GATED = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Olmo2MLP", "GraniteMLP",
          "Phi3MLP", "SmolLM3MLP")
# Set on a patched MLP: its forward before (restored by restore_activation).
_ORIGINAL = "_structspec_forward"


# The kernel fused_forward calls, set by use_fused_activation (a lookup per call — the
# native switch's environment read, the CPU check — cost more than the kernel's own call).
_FUSED: list[Any] = [None]


def fused_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with the activation fused (in place on
    the gate's output) where it is a contiguous CPU float32 tensor outside autograd; torch's
    operators otherwise."""
    g = self.gate_proj(x)
    u = self.up_proj(x)
    kernel = _FUSED[0]
    if (kernel is None or g.dtype != torch.float32 or u.dtype != torch.float32
            or g.device.type != "cpu" or g.shape != u.shape or not g.is_contiguous()
            or not u.is_contiguous() or torch.is_grad_enabled()):
        return self.down_proj(self.act_fn(g) * u)
    kernel.silu_mul(g.data_ptr(), u.data_ptr(), g.numel())
    return self.down_proj(g)


def _silu(act: Any) -> bool:
    return type(act).__name__ in ("SiLU", "SiLUActivation") or act is torch.nn.functional.silu


def use_fused_activation(model: Any) -> int:
    """Give ``model``'s gated SiLU MLPs :func:`fused_forward` (in place, idempotent), where
    the native kernel runs and the model is CPU float32; returns how many MLPs use it. Each
    MLP class is probed once: its own forward and the fused one must give the same bits on
    a random input, else none of that class is changed."""
    kernel = _native.runnable("gated")
    if kernel is None:
        return 0
    _FUSED[0] = kernel
    probed: dict[type, bool] = {}
    count = 0
    for module in model.modules():
        cls = type(module)
        if getattr(module, _ORIGINAL, None) is not None:
            count += 1
            continue
        if cls.__name__ not in _GATED or not _silu(getattr(module, "act_fn", None)):
            continue
        # Plain or packed projections only (a tensor-parallel shard's gathers are not probed)
        layers: list[Any] = [getattr(module, n, None)
                             for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(layer).__name__ not in ("Linear", "PackedLinear") for layer in layers):
            continue
        weight = layers[0].weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            continue
        if cls not in probed:
            probed[cls] = _agrees(module, int(weight.shape[1]))
        if not probed[cls]:
            continue
        setattr(module, _ORIGINAL, module.forward)
        module.forward = types.MethodType(fused_forward, module)
        count += 1
    return count


def _agrees(module: Any, width: int) -> bool:
    """Whether ``module``'s forward and :func:`fused_forward` give the same bits on probe
    inputs."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for scale in (1.0, 30.0):
            x = torch.randn(1, 3, width, generator=gen) * scale
            want = module.forward(x)
            got = fused_forward(module, x)
            if want.shape != got.shape or not torch.equal(got, want):
                return False
    return True


def restore_activation(model: Any) -> None:
    """Undo :func:`use_fused_activation` (no-op on MLPs it did not change)."""
    for module in model.modules():
        original = getattr(module, _ORIGINAL, None)
        if original is not None:
            module.forward = original
            delattr(module, _ORIGINAL)


def fused_count(model: Any) -> int:
    """How many of ``model``'s MLPs run the fused activation."""
    return sum(1 for m in model.modules() if getattr(m, _ORIGINAL, None) is not None)
