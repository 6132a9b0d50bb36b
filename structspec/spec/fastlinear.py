"""Packed linears: make forward passes of a few rows cheap on CPU.

A draft tree is a pass of 2–32 rows. On CPU, MKL's SGEMM re-reads each weight matrix per
few rows, so a 8-row pass of the default model costs ~2.3× a 1-row pass instead of the
~1.3–1.5× arithmetic allows. Two kernels pack each ``nn.Linear`` weight once:

- ``"panel"`` (default where it runs): our AVX2+FMA kernel (``structspec/_native/smallgemm.c``):
  the weight in panels of 16 output columns, streamed once per pass while up to 6 rows are
  multiplied against it (passes of 6 to 64 rows copied first into k-major blocks of 6). On an
  AVX2 EPYC (2 cores, the 210 linears of the default model, ``docs/performance.md``) it is
  1.1–1.8× faster than oneDNN at pass sizes from 1 to 256 rows on 1 thread and up to 64 on 2
  (even, within noise, beyond). Where the CPU has AVX-512F (:func:`avx512`), AVX-512
  versions run instead: blocks of up to 12 rows against two panels, quantized panels (below)
  up to :data:`QUANT_MAX_ROWS_AVX512` rows against up to four. Each output is the same
  in-order FMA chain over the input features whatever the number of rows, so a row's result
  is **bitwise** the same in a pass of 1 row and in a tree pass of 32: speculation and plain
  decoding see identical numbers from these layers.
- ``"onednn"``: oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` +
  ``_linear_pointwise``), where the panel kernel is not built or the CPU lacks AVX2/FMA
  (DESIGN.md, AMD Zen 3: t(2) 1.15×, t(8) 1.52×, t(32) 2.19× of t(1)).

Both stay within 1e-4 of the unpacked model. Where a weight is *exactly* block-quantized
(the default model's: float32 numbers dequantized from GGUF Q4_1 and Q8_0, found bit for
bit by :mod:`structspec.spec.block_quant`), a ``"panel"`` layer also keeps it as one byte per
weight plus a scale and offset per 32, and passes of up to :data:`QUANT_MAX_ROWS` rows read
that copy, widened in the kernel to the very same float32 numbers: the same chains, the same
bits, from a third of the bytes (a 1-row pass of the default model costs 0.72 of the same
pass on float32 panels on an AVX2 EPYC, 2-4 rows 0.86-0.89; longer passes keep the float32
panels, where widening the weights costs what their bytes save).

A third, lossy kernel, ``"panel_f16"``, stores the panels in half precision (read at half
the bytes, computed in float32): for drafters only (the learned draft head), whose numbers
never reach the output; it is never chosen by default.

An approximate kernel, ``"panel_int8"``, runs the layers whose weights are exactly
block-quantized — with non-negative q (GGUF Q4_1: the default model's body), or signed q and
no offset (GGUF Q8_0: its tied output layer) — as llama.cpp runs them: the activations
rounded to 8 bits per block of 32, the products integer dot products
(``structspec/_native/qdot.c``: AVX512-VNNI, or AVX2) — a quarter of the instructions per
weight and row of the float32 kernels, for every pass size; on a CPU with AMX, passes of
:func:`amx_from_rows` rows or more leave the dot products to its tiles (the same bits).
Outputs differ from the float32 model by the activations' rounding (~0.4% of a layer's
largest output), so it is not a lossless kernel; it keeps what speculation needs: a row's
numbers are bitwise the same whatever the pass size (integer sums are exact), and with the
row-exact attention of :mod:`structspec.spec.attention` speculative decoding gives exactly
what plain decoding gives *with this kernel* (without it, SDPA's ~1e-7 differences between
pass shapes cross rounding boundaries and grow to ~0.4 in the logits). Other layers run as
``"panel"``.

:func:`pack_linears` swaps modules in place and keeps the originals, so :func:`unpack_linears`
restores the model exactly. Packed weights are an extra copy of every linear weight (≈ the
model's size again) — unless :func:`release_originals` lets the originals go: the float32
and integer panels hold every weight exactly (a float panel is the weight's numbers
reordered; an integer one the ``d*q + m`` they were recovered from), so an original is
rebuilt from them bit for bit when something asks for it (``.original``, ``state_dict``,
``unpack_linears``, autograd, ``.to()``). Inference only (no autograd through the packed op).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from structspec import _native
from structspec.spec import block_quant
from structspec.spec.hugepages import release_huge_pages
from structspec.spec.prompt_rows import PROMPT_ROWS

# The native module, set when the first panel layer is packed (not an attribute of the
# layers: a module object there would make them impossible to deep-copy).
_SMALLGEMM: Any = None

#: The packing kernels that keep the model's outputs (within 1e-4), best first.
KERNELS = ("panel", "onednn")
#: Bumped whenever the kernels' speed changes (not their results): cost curves cached on disk
#: under an older revision are measured again (:func:`structspec.spec.cost.device_cost_curve`).
#: 4: 6+1 rows as one 7-row block, 6+6+2 as 6+4+4 (session 16). 5: passes of two or more
#: row blocks take each panel in chunks, the next chunk prefetched (session 17).
#: 6: passes of up to QUANT_MAX_ROWS rows read exactly quantized panels (session 18).
#: 7: AVX-512 kernels where the CPU has them (session 19).
#: 8: "panel_int8" and row-exact attention (session 21). 9: "panel_int8" rounds activations
#: with vectors (session 22). 10: signed kernels (the output layer), next panels prefetched.
#: 11: "panel_int8" passes of 6+ rows on AMX tiles where the CPU has them (session 40).
#: 12: row-exact attention on 512-bit vectors where the CPU has AVX-512 (session 42).
#: 13: "panel_int8" passes of up to 19 rows on VNNI read each panel once (session 47).
KERNEL_REVISION = 13
#: Passes of up to this many rows read a layer's exactly quantized panels where it has them
#: (whole passes of the default model, 1 thread, paired rounds: 1 row 0.72 of the float32
#: panels, 2 rows 0.86, 4 rows 0.89, 6 rows 1.00 — there the widening costs what the bytes
#: save — and beyond, where a pass has two row blocks, each widening the weights again).
QUANT_MAX_ROWS = 5
#: The same with the AVX-512 kernels (``smallgemm.c``, "AVX-512 kernels": there quantized
#: panels cost 0.60-0.80 of float32 ones up to 8 rows).
QUANT_MAX_ROWS_AVX512 = 8
# quant_max_rows() as of the last change (read on every pass, so not asked of C each time).
_QUANT_MAX = [QUANT_MAX_ROWS]
#: Output columns per panel (``PANEL`` in ``smallgemm.c`` and ``qdot.c``).
PANEL = 16
#: Bytes of an integer panel per block of 32 inputs (``QBYTES`` in ``qdot.c``).
_QBYTES = 640
# The native ``qdot`` module, set when the first integer panels are packed.
_QDOT: list[Any] = [None]
#: The prompt rows' kernel (``promptdot``), set where a layer gets prompt panels.
_PROMPTDOT: list[Any] = [None]
#: Kernels that round the weights (half precision): for drafters, never a default.
LOSSY_KERNELS = ("panel_f16",)
#: Kernels that round the activations of exactly quantized layers (8 bits per block of 32, as
#: llama.cpp does): never :func:`pack_linears`' default; :func:`~structspec.spec.cpu_paths.
#: use_fast_cpu_paths` (and so a ``Generator``) choose it unless told not to.
APPROX_KERNELS = ("panel_int8",)
#: Where a kernel's pass cost steps up, as ``(b, last)`` per step: passes of ``b`` (a multiple
#: of the rows a kernel multiplies per sweep of a weight panel, ``ROWS`` in ``smallgemm.c``)
#: to ``last`` rows cost about the same, one row more adds a block's sweep
#: (``plan_blocks`` in ``smallgemm.c``: 6+1 rows run as one 7-row block where float32 x is
#: packed, 6+6+2 as 6+4+4). The cost curve is a staircase the planner must see
#: (:func:`structspec.spec.cost.curve_sizes`).
COST_STEPS = {"panel": ((6, 7), (12, 14), (18, 20)),
              "panel_f16": ((6, 6), (12, 14), (18, 20))}
#: The same where the AVX-512 kernels run: float32 panels in near-even blocks of at most 12
#: rows (``SZ_ROWS``); half panels keep the AVX2 kernels.
COST_STEPS_AVX512 = {"panel": ((12, 12), (24, 24)),
                     "panel_f16": COST_STEPS["panel_f16"]}
#: The same for ``"panel_int8"``'s integer kernels (``qdot.c``): AVX2 in near-even blocks of
#: at most 3 rows; AVX512-VNNI one panel against blocks of at most 12 rows up to 19 rows
#: (:func:`one_panel_rows`: 1-4 rows bound by the weight stream, 5-12 rows about in
#: proportion to their rows, 13-19 sweep each panel twice), two panels against blocks of 6
#: beyond.
COST_STEPS_INT8 = {True: ((4, 4), (12, 12), (19, 19), (24, 24)),
                   False: ((3, 3), (6, 6), (9, 9), (12, 12), (15, 15), (18, 18), (24, 24))}
#: The same where passes of 6 rows or more run on AMX tiles (``run_amx`` in ``qdot.c``): up
#: to 5 rows one VNNI block, then blocks of 16 rows (each block a tile product per 32-k block
#: and panel, whatever its rows), a last block of 1-5 rows on VNNI.
COST_STEPS_INT8_AMX = ((5, 5), (16, 16), (21, 21), (32, 32))
#: AVX2 with narrow panels (4-bit weights: the default model's body): passes of 2 rows or more
#: run the half-panel kernels in near-even blocks of at most 12 (the signed output layer from
#: 2 to 7 rows, then blocks of 3).
COST_STEPS_INT8_NARROW = ((7, 7), (12, 12), (24, 24))


def _onednn_available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return (ops is not None and hasattr(ops, "_reorder_linear_weight")
                and hasattr(ops, "_linear_pointwise") and torch.backends.mkldnn.is_available())
    except (AttributeError, RuntimeError):  # pragma: no cover - exotic builds
        return False


def available_kernels(lossy: bool = False, approx: bool = False) -> tuple[str, ...]:
    """The kernels of :data:`KERNELS` (and, with ``lossy``, :data:`LOSSY_KERNELS`; with
    ``approx``, :data:`APPROX_KERNELS`) that run here, best first. The panel kernels need the
    native module ``smallgemm``, an x86-64 CPU with AVX2 and FMA (F16C for ``panel_f16``),
    and native kernels not switched off by ``STRUCTSPEC_NATIVE=off``; ``panel_int8`` also
    the native module ``qdot``."""
    found = []
    module = _native.load("smallgemm")
    if module is not None and module.available():
        found.append("panel")
    if _onednn_available():
        found.append("onednn")
    if lossy and module is not None and module.available(True):
        found.append("panel_f16")
    qdot = _native.load("qdot")
    if (approx and "panel" in found and module is not None and module.available(True)
            and qdot is not None and qdot.available()):
        found.append("panel_int8")
    return tuple(found)


def packing_available(model: Any | None = None) -> bool:
    """Whether :func:`pack_linears` can pack ``model`` (a kernel runs here; CPU, float32)."""
    return bool(available_kernels()) and (model is None or cpu_float32(model))


def cpu_float32(model: Any) -> bool:
    """Whether ``model``'s parameters are float32 on the CPU (what the native paths take)."""
    try:
        param = next(model.parameters())
    except StopIteration:
        return False
    return param.device.type == "cpu" and param.dtype == torch.float32


class _Released(nn.Module):
    """What stands for a :class:`PackedLinear`'s original ``nn.Linear`` once its weight is
    let go (:meth:`PackedLinear.release_original`): the bias, still a parameter under the
    original's name, and what a rebuilt weight needs. No forward: the packed layer asks
    for the original, which it rebuilds, whenever it would have run it."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.bias = linear.bias
        #: Whether the released weight required grad (a rebuilt one does too).
        self.weight_grad = linear.weight.requires_grad

    def extra_repr(self) -> str:
        return "weight released: in the panels"


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is packed once for a small-pass kernel. Inference only.

    Attributes:
        original: the replaced ``nn.Linear`` (kept for :func:`unpack_linears`).
        kernel: one of :data:`KERNELS` or :data:`LOSSY_KERNELS`.
    """

    def __init__(self, linear: nn.Linear, kernel: str = "panel", quantized: bool = True) -> None:
        super().__init__()
        known = KERNELS + LOSSY_KERNELS + APPROX_KERNELS
        if kernel not in known:
            raise ValueError(f"unknown linear kernel {kernel!r}; expected one of {known}")
        self.original = linear
        self.kernel = kernel
        #: The exactly quantized panels (``"panel"`` only; None where the weight is not).
        self._qpacked: torch.Tensor | None = None
        #: The integer panels (``"panel_int8"`` only; None where the weight is not exactly
        #: quantized as qdot takes it): every pass of this layer runs on them.
        self._ipacked: torch.Tensor | None = None
        #: Whether they hold signed q without offsets (qdot's signed kernels).
        self._signed = False
        #: Whether every q is small enough for qdot's narrow AVX2 kernels (4-bit weights).
        self._narrow = False
        #: Whether the panels hold a rounded copy of ``original`` (:func:`rounded_int8`).
        self._rounded = False
        #: The weight rounded for a prompt's rows (:mod:`~structspec.spec.prompt_rows`;
        #: ``None``: prompt rows run as any other).
        self.prompt_panels: torch.Tensor | None = None
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            weight = linear.weight.detach().to(torch.float32).contiguous()
            # Plain attributes, not buffers: state_dict and .to() keep seeing the original.
            self._bias = None if linear.bias is None else linear.bias.detach().contiguous()
            self._half = kernel == "panel_f16"
            if kernel in ("panel", "panel_f16", "panel_int8"):
                gemm = _native.load("smallgemm")
                if gemm is None or not gemm.available(self._half):
                    raise RuntimeError(f"the {kernel} kernel (native smallgemm, AVX2+FMA"
                                       f"{'+F16C' if self._half else ''}) is not available here")
                n, k = self.out_features, self.in_features
                # recovered once: the integer panels and the quantized ones both start from it
                found = (_recover(gemm, weight)
                         if kernel == "panel_int8" or (kernel == "panel" and quantized) else None)
                if kernel == "panel_int8" and found is not None:
                    packed_int8 = _pack_int8(*found)
                    if packed_int8 is not None:
                        self._ipacked, self._signed, self._narrow = packed_int8
                # float32 panels for what the integer ones do not run
                self._packed = torch.empty(0 if self._ipacked is not None
                                           else gemm.packed_size(n, k),
                                           dtype=torch.float16 if self._half else torch.float32)
                if self._ipacked is None:
                    gemm.pack(self._packed.data_ptr(), weight.data_ptr(), n, k, self._half)
                    if found is not None and quantized:
                        self._qpacked = _pack_q(gemm, *found)
                global _SMALLGEMM
                if _SMALLGEMM is None:
                    _SMALLGEMM = gemm
                    _QUANT_MAX[0] = quant_max_rows()
            else:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedLinear:
        """A copy of the original layer, packed again (oneDNN's packed weight cannot be
        copied)."""
        import copy

        held = self._modules["original"]
        # a released original is rebuilt for the copy alone (this layer stays released)
        if isinstance(held, _Released):
            held = self._rebuilt_linear(held)
        original = cast(nn.Linear, copy.deepcopy(held, memo))
        again = rounded_int8(original) if self._rounded else None  # rounded again
        if again is None:
            again = PackedLinear(original, self.kernel, self._qpacked is not None)
        if self.prompt_panels is not None and again.int8:
            again.prompt_panels = self.prompt_panels.clone()
        return again

    @property
    def original(self) -> nn.Linear:
        """The replaced ``nn.Linear``; where :meth:`release_original` let it go, rebuilt
        from the panels (bit for bit, with the same bias parameter) and kept from then on."""
        held = self._modules["original"]
        if isinstance(held, _Released):
            held = self._rebuilt_linear(held)
            self._modules["original"] = held
        return cast(nn.Linear, held)

    @original.setter
    def original(self, linear: nn.Module) -> None:
        # (nn.Module.__setattr__ registers a module before a property setter would run;
        # this says the same for type checkers)
        self._modules["original"] = linear

    @property
    def released(self) -> bool:
        """Whether the original ``nn.Linear``'s weight is let go (:meth:`release_original`)."""
        return isinstance(self._modules["original"], _Released)

    @property
    def weight(self) -> torch.Tensor:
        """The original (unpacked) weight, for code that inspects it (a released original
        comes back for it: see :meth:`dense_weight` to read without keeping it)."""
        return self.original.weight

    def dense_weight(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` without autograd: the original's, or rebuilt
        from the panels where the original is released (a fresh tensor, not kept)."""
        if self.released:
            return self._rebuild()
        return self.original.weight.detach()

    def weight_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of :meth:`dense_weight` ``[len(ids), in]``, float32 and contiguous,
        read from the panels where they hold the weight (the draft head takes a few
        thousand rows of a 49,152-row output layer: without rebuilding the rest)."""
        ids = ids.to(torch.int64).contiguous()
        if self._floats_exact():
            panels = self._packed.view(-1, self.in_features, PANEL)
            return panels[ids // PANEL, :, ids % PANEL].contiguous()
        if self._ipacked is not None and _QDOT[0] is not None:
            count = int(ids.numel())
            if not count:
                return torch.empty(0, self.in_features, dtype=torch.float32)
            return _unpack_int8(_int8_columns(self, ids), count, self.in_features,
                                self._signed)
        return self.dense_weight().index_select(0, ids).to(torch.float32).contiguous()

    def _floats_exact(self) -> bool:
        """Whether float32 panels hold every weight (``"panel"``; not half, not rounded)."""
        return (self.kernel in ("panel", "panel_int8") and self._ipacked is None
                and not self._half and not self._rounded and self._packed.numel() > 0)

    def releasable(self) -> bool:
        """Whether the panels give the original weight back exactly (float32 or integer
        panels of this layer's own weight; not oneDNN's opaque layout, half precision or a
        drafter's rounded copy)."""
        return not self._rounded and (self._floats_exact() or self._ipacked is not None)

    def release_original(self) -> bool:
        """Let the original ``nn.Linear``'s weight go, keeping only the panels, once a
        rebuild from them has matched it bit for bit. True where it is released (now or
        before); False where it cannot be (:meth:`releasable`, a subclass of ``nn.Linear``,
        or a rebuild that differs). Whoever else holds the weight keeps it alive: a tied
        output layer frees nothing (:func:`release_originals` skips those)."""
        if self.released:
            return True
        held = self.original
        if type(held) is not nn.Linear or not self.releasable():
            return False
        weight = held.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            return False
        rebuilt = self._rebuild()
        if rebuilt.shape != weight.shape or not torch.equal(
                rebuilt.view(torch.int32), weight.detach().contiguous().view(torch.int32)):
            return False
        self._modules["original"] = _Released(held)
        return True

    def _rebuild(self) -> torch.Tensor:
        """The weight ``[out, in]`` from the panels, bit for bit what was packed."""
        n, k = self.out_features, self.in_features
        if self._ipacked is not None:
            return _unpack_int8(self._ipacked, n, k, self._signed)
        if not self._floats_exact():
            raise ValueError(f"a {self.kernel} layer's panels do not hold its weight exactly")
        panels = self._packed.view(-1, k, PANEL)
        return panels.permute(0, 2, 1).reshape(-1, k)[:n].contiguous()

    def _rebuilt_linear(self, released: _Released) -> nn.Linear:
        """A new ``nn.Linear`` with the rebuilt weight and ``released``'s bias parameter."""
        linear = nn.Linear(self.in_features, self.out_features, bias=False, device="meta")
        linear.weight = nn.Parameter(self._rebuild(), requires_grad=released.weight_grad)
        linear.bias = released.bias
        return linear

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        """A released original's weight under the key a held one has (rebuilt; its bias
        follows from the placeholder, a parameter still)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.released:
            destination[prefix + "original.weight"] = self._rebuild()

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        """A state dict naming this layer's original brings a released one back first, so
        that it loads as a held one does (the panels keep what they were packed from)."""
        if self.released and any(key.startswith(prefix + "original.") for key in state_dict):
            _ = self.original
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> PackedLinear:
        """``.to()``, ``.half()``, ``.cuda()``…: a released original comes back first where
        ``fn`` changes a tensor's device or dtype, so that it moves as a held one does."""
        if self.released:
            probe = torch.empty(0)
            moved = fn(probe)
            if moved.dtype != probe.dtype or moved.device != probe.device:
                _ = self.original
        return cast(PackedLinear, super()._apply(fn, *args, **kwargs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.original(x)
        x = x.contiguous()
        if self.kernel == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias,
                                                      "none", [], "")
        rows = x.numel() // self.in_features
        out = torch.empty(*x.shape[:-1], self.out_features, dtype=torch.float32)
        if rows and self._ipacked is not None:
            prompt = PROMPT_ROWS.get() if self.prompt_panels is not None else 0
            if prompt and x.dim() == 3 and x.shape[0] == 1:  # one sequence's pass
                self._prompt_into(x, min(prompt, rows), rows, out)
            else:
                self._int8_into(x, rows, out)
        elif rows:
            quant = self._qpacked is not None and rows <= _QUANT_MAX[0]
            packed = self._qpacked if quant else self._packed
            assert packed is not None  # quant: there are quantized panels
            _SMALLGEMM.linear(x.data_ptr(), rows, self.in_features, packed.data_ptr(),
                              self.out_features,
                              0 if self._bias is None else self._bias.data_ptr(),
                              out.data_ptr(), torch.get_num_threads(),
                              2 if quant else int(self._half))
        return out

    def int8_rows(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` on the integer panels for rows ``x`` ``[m, in]`` the caller has
        made float32, contiguous and on CPU, with autograd off (``[m, out]``; the same bits).
        Without ``forward``'s checks: the draft head calls its layers a few times per drafted
        level, each a few microseconds of arithmetic, where the checks and the module call
        were a third of a step (session 56).

        Raises:
            ValueError: the layer has no integer panels (:attr:`int8`)."""
        if self._ipacked is None:
            raise ValueError("int8_rows needs a layer on integer panels (PackedLinear.int8)")
        rows = x.shape[0]
        out = torch.empty(rows, self.out_features, dtype=torch.float32)
        if rows:
            self._int8_into(x, rows, out)
        return out

    def native_args(self) -> tuple[int, int, int, bool, bool]:
        """``(panels, out_features, bias, signed, narrow)``: what a native caller of qdot's
        integer linear passes for this layer (addresses as integers, ``0`` for no bias; the
        layer keeps the memory alive). See ``structspec/_native/headstep.c``.

        Raises:
            ValueError: the layer has no integer panels (:attr:`int8`)."""
        if self._ipacked is None:
            raise ValueError("native_args needs a layer on integer panels (PackedLinear.int8)")
        return (self._ipacked.data_ptr(), self.out_features,
                0 if self._bias is None else self._bias.data_ptr(), self._signed, self._narrow)

    def _int8_into(self, x: torch.Tensor, rows: int, out: torch.Tensor) -> None:
        """The integer kernel on ``rows`` contiguous float32 rows of ``x`` into ``out``."""
        assert self._ipacked is not None  # both callers checked
        _QDOT[0].linear(x.data_ptr(), rows, self.in_features, self._ipacked.data_ptr(),
                        self.out_features, 0 if self._bias is None else self._bias.data_ptr(),
                        out.data_ptr(), torch.get_num_threads(), self._signed, self._narrow)

    def _prompt_into(self, x: torch.Tensor, prompt: int, rows: int, out: torch.Tensor) -> None:
        """The first ``prompt`` rows on the prompt panels, the rest on the integer ones."""
        assert self.prompt_panels is not None and self._ipacked is not None
        threads = torch.get_num_threads()
        bias = 0 if self._bias is None else self._bias.data_ptr()
        _PROMPTDOT[0].linear(x.data_ptr(), prompt, self.in_features,
                             self.prompt_panels.data_ptr(), self.out_features, bias,
                             out.data_ptr(), threads)
        if rows > prompt:  # a tree's rows after the prompt's: the shared kernel's numbers
            _QDOT[0].linear(x.data_ptr() + 4 * prompt * self.in_features, rows - prompt,
                            self.in_features, self._ipacked.data_ptr(), self.out_features,
                            bias, out.data_ptr() + 4 * prompt * self.out_features, threads,
                            self._signed, self._narrow)

    @property
    def quantized(self) -> bool:
        """Whether small passes read exactly quantized panels (see the module docstring)."""
        return self._qpacked is not None

    @property
    def int8(self) -> bool:
        """Whether every pass runs on integer panels, activations rounded to 8 bits
        (``"panel_int8"`` on an exactly quantized weight)."""
        return self._ipacked is not None

    def extra_repr(self) -> str:
        how = ", int8-activations" if self.int8 else (", exact-quantized" if self.quantized
                                                       else "")
        how += ", original released" if self.released else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"packed={self.kernel}{how}")


def smallgemm() -> Any:
    """The native ``smallgemm`` module the ``"panel"`` layers run on (``None`` where it is not
    built)."""
    return _SMALLGEMM if _SMALLGEMM is not None else _native.load("smallgemm")


def _unpack_int8(packed: torch.Tensor, n: int, k: int, signed: bool) -> torch.Tensor:
    """The float32 weight ``[n, k]`` that ``qdot``'s integer panels ``packed`` hold, bit for
    bit: ``d*q + m`` per block of 32 (``d*q`` is exact, so one rounding, as the recovery
    checked; signed panels have no offsets, and there ``d*q`` alone is the weight). Layout
    (``qdot.c``): per panel of 16 columns and block of 32 k, 8 groups of 4 k x 16 columns x
    4 bytes, then 16 scales and 16 offsets (or sums, signed) as 4-byte words."""
    blocks = k // block_quant.BLOCK
    raw = packed.view(torch.uint8).view(-1, blocks, _QBYTES)  # [panels, blocks, 640]
    panels = raw.shape[0]
    q = raw[:, :, :512].reshape(panels, blocks, 8, PANEL, 4).view(torch.int8)
    q = q.permute(0, 3, 1, 2, 4).reshape(panels * PANEL, k)[:n]  # [n, k]
    words = raw[:, :, 512:].contiguous().view(torch.float32)  # [panels, blocks, 32]
    d = words[:, :, :PANEL].permute(0, 2, 1).reshape(panels * PANEL, blocks)[:n]
    weight = q.to(torch.float32).view(n, blocks, block_quant.BLOCK) * d.unsqueeze(-1)
    if not signed:
        m = words[:, :, PANEL:].permute(0, 2, 1).reshape(panels * PANEL, blocks)[:n]
        weight = weight + m.unsqueeze(-1)
    return weight.reshape(n, k).contiguous()


def _recover(gemm: Any, weight: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(q, d, m)`` with ``weight == d*q + m`` bit for bit per block of 32 (``gemm``'s
    ``recover_q``), or None where there are none or ``gemm`` cannot look."""
    n, k = weight.shape
    if (gemm is None or k % block_quant.BLOCK or not hasattr(gemm, "recover_q")
            or not gemm.available(True)):
        return None
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // block_quant.BLOCK, dtype=torch.float32)
    m = torch.empty_like(d)
    if not gemm.recover_q(weight.data_ptr(), n, k, q.data_ptr(), d.data_ptr(), m.data_ptr()):
        return None
    return q, d, m


def _pack_q(gemm: Any, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``gemm``'s quantized panels of ``d*q + m`` (as :func:`_recover` found them)."""
    n, k = q.shape
    packed = torch.empty(gemm.packed_bytes_q(n, k), dtype=torch.int8)
    gemm.pack_q(packed.data_ptr(), q.data_ptr(), d.data_ptr(), m.data_ptr(), n, k)
    return packed


def pack_quantized(gemm: Any, weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (float32 [n, k]) as ``gemm``'s (a build of the native ``smallgemm``)
    quantized panels, or None where it is not exactly block-quantized (or the module
    predates them)."""
    found = _recover(gemm, weight)
    return None if found is None else _pack_q(gemm, *found)


def _pack_int8(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor
               ) -> tuple[torch.Tensor, bool, bool] | None:
    """``d*q + m`` (as :func:`_recover` found them) as ``qdot``'s integer panels, whether
    they are its signed kind (some q negative, every m zero: GGUF Q8_0, Q4_0) and whether
    they are narrow (unsigned, every q at most ``qdot.narrow_max()``: 4-bit weights such as
    GGUF Q4_1, which its AVX2 kernels run 12 rows at a time), or None where the weight is
    neither kind (negative q with offsets) or ``qdot`` is not built."""
    qdot = _native.load("qdot")
    if qdot is None or not qdot.available():
        return None
    n, k = q.shape
    # numpy's reductions over int8 are vectorized (~0.01 s for the default model's layers);
    # torch's (q < 0).any() and q.max() took ~0.17 s on a quiet machine, 2.3 s on a busy
    # one (session 66)
    values = q.numpy()
    lowest, highest = int(values.min()), int(values.max())
    packed = torch.empty(qdot.packed_bytes(n, k), dtype=torch.uint8)
    signed = lowest < 0
    if signed:
        if bool(np.count_nonzero(m.numpy())) or not hasattr(qdot, "pack_signed"):
            return None
        qdot.pack_signed(packed.data_ptr(), q.data_ptr(), d.data_ptr(), n, k)
    elif not qdot.pack(packed.data_ptr(), q.data_ptr(), d.data_ptr(), m.data_ptr(), n, k):
        return None
    narrow = (not signed and hasattr(qdot, "narrow_max")
              and highest <= int(qdot.narrow_max()))
    _QDOT[0] = qdot
    return packed, signed, narrow


def rounded_int8(linear: nn.Linear) -> PackedLinear | None:
    """``linear`` run by ``"panel_int8"`` with its weight rounded to GGUF Q8_0 blocks (a
    half-precision scale and integers -127..127 per block of 32 inputs): a quarter of the
    bytes of float32 panels, half of ``"panel_f16"``'s. Lossy, for drafters only (the draft
    head's inner layers: its numbers rank guesses that the target verifies). None where the
    integer kernel does not run here, the layer is not float32 on CPU, or its input width is
    not a multiple of 32. The result keeps ``linear`` itself as its ``original`` (autograd,
    ``state_dict`` and saving see the unrounded weight); ``linear`` is not changed."""
    weight = linear.weight
    if ("panel_int8" not in available_kernels(approx=True) or weight.device.type != "cpu"
            or weight.dtype != torch.float32 or linear.in_features % block_quant.BLOCK):
        return None
    rounded = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    with torch.no_grad():
        quant = block_quant.quantize_q8_0(weight.detach().numpy())
        rounded.weight.copy_(torch.from_numpy(block_quant.dequantize(quant)))
        if linear.bias is not None:
            rounded.bias.copy_(linear.bias.detach())
    packed = PackedLinear(rounded, "panel_int8")
    if not packed.int8:  # (a block the recovery refuses: keep the float kernels)
        return None
    packed.original = linear
    packed._rounded = True
    return packed


def _int8_columns(layer: PackedLinear, ids: torch.Tensor) -> torch.Tensor:
    """New integer panels holding output columns ``ids`` (int64, contiguous, not empty) of
    ``layer``'s, in that order (qdot's gather: a column's bytes, scale and offset as they
    were)."""
    qdot, k, count = _QDOT[0], layer.in_features, int(ids.numel())
    assert layer._ipacked is not None and qdot is not None  # both callers checked
    packed = torch.empty(qdot.packed_bytes(count, k), dtype=torch.uint8)
    qdot.gather(packed.data_ptr(), layer._ipacked.data_ptr(), ids.data_ptr(), count,
                layer.out_features, k)
    return packed


def gathered_int8(layer: PackedLinear, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``layer(x)[..., ids]`` ``[m, len(ids)]`` for an :attr:`PackedLinear.int8` layer and
    rows ``x`` ``[m, in]``, bit for bit, from those columns' integer panels alone (a column's
    numbers do not depend on its place among the others)."""
    qdot = _QDOT[0]
    if layer._ipacked is None or qdot is None:
        raise ValueError("gathered_int8 needs a layer that runs on integer panels")
    k = layer.in_features
    ids = ids.to(torch.int64).contiguous()
    count = int(ids.numel())
    x = x.to(torch.float32).contiguous()
    m = x.numel() // k
    out = torch.empty(m, count, dtype=torch.float32)
    if not m or not count:
        return out
    packed = _int8_columns(layer, ids)
    bias = None if layer._bias is None else (
        layer._bias.index_select(0, ids).to(torch.float32).contiguous())
    qdot.linear(x.data_ptr(), m, k, packed.data_ptr(), count,
                0 if bias is None else bias.data_ptr(), out.data_ptr(), 1, layer._signed,
                layer._narrow)
    return out


def pack_linears(model: nn.Module, kernel: str | None = None,
                 quantized: bool = True) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (``lm_head`` included) by a
    :class:`PackedLinear`, in place; returns ``model``.

    ``kernel``: one of :data:`KERNELS` (or :data:`LOSSY_KERNELS`, for drafters); by default the
    best lossless one that runs here (:func:`available_kernels`). Does nothing (and returns
    ``model`` unchanged) when packing is unavailable: no kernel runs here, or the model is not
    float32 on CPU; a named kernel that does not run here raises ``ValueError``. Idempotent
    (already packed layers keep their kernel). Mutates ``model``; not thread-safe against
    concurrent forwards. The originals stay registered (as ``<name>.original``), so parameters
    and ``model.device`` are unchanged but ``state_dict`` keys are not: call
    :func:`unpack_linears` before saving. Calls run under ``torch.no_grad`` or
    ``inference_mode`` use the packed path; with autograd enabled each layer falls back to its
    original ``nn.Linear``. ``quantized=False`` keeps ``"panel"`` layers off their exactly
    quantized panels (same outputs, for measuring them against the float32 panels alone).
    """
    kernels = available_kernels(lossy=kernel in LOSSY_KERNELS, approx=kernel in APPROX_KERNELS)
    if kernel is not None and kernel not in kernels:
        raise ValueError(f"linear kernel {kernel!r} does not run here; available: {kernels}")
    lossless = [k for k in kernels if k in KERNELS]
    if not lossless or not cpu_float32(model):
        return model
    chosen = kernel or lossless[0]
    return replace_linears(model, lambda linear: PackedLinear(linear, chosen, quantized))


def replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module | None]
                    ) -> nn.Module:
    """Replace every plain ``nn.Linear`` of ``model`` (not those already inside a
    :class:`PackedLinear`) by ``make(linear)`` where that is not None, in place; returns
    ``model``."""
    for parent in list(model.modules()):
        if isinstance(parent, PackedLinear):
            continue
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                replacement = make(child)
                if replacement is not None:
                    setattr(parent, name, replacement)
    return model


def unpack_linears(model: nn.Module) -> nn.Module:
    """Undo :func:`pack_linears`: put the original ``nn.Linear`` modules back, and let go of
    the huge-page arena their panels may have moved to (:mod:`structspec.spec.hugepages`).
    In place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.original)
    release_huge_pages(model)
    return model


def release_originals(model: nn.Module) -> int:
    """Let go of the original weights of ``model``'s packed linears where the panels give
    them back exactly (:meth:`PackedLinear.release_original`) and nothing else in ``model``
    holds them (a tied output layer shares the input embedding: freeing it would free
    nothing), where they live in the process's own memory: a weight mapped from its
    checkpoint file (:func:`~structspec.spec.heap.file_backed`) is the OS's page cache,
    which letting go would not shrink. In place; returns how many were released. Saves a
    float32 copy of each such weight: the model's size again for a float model converted
    on loading (a bfloat16 checkpoint run in float32)."""
    from structspec.spec.heap import file_backed

    holders = collections.Counter(
        id(param) for _, param in model.named_parameters(remove_duplicate=False))
    layers = [layer for layer in model.modules() if isinstance(layer, PackedLinear)
              and not layer.released and holders.get(id(layer.original.weight), 0) == 1]
    mapped = file_backed([layer.original.weight.data_ptr() for layer in layers])
    return sum(1 for layer, in_file in zip(layers, mapped)
               if not in_file and layer.release_original())


def is_packed(model: nn.Module) -> bool:
    """Whether any linear of ``model`` is packed."""
    return packed_kernel(model) is not None


def packed_kernel(model: nn.Module) -> str | None:
    """The kernel of ``model``'s packed linears (the first found), or ``None``."""
    return next((m.kernel for m in model.modules() if isinstance(m, PackedLinear)), None)


def quantized_count(model: nn.Module) -> int:
    """How many of ``model``'s packed linears read exactly quantized panels in small passes."""
    return sum(1 for m in model.modules() if isinstance(m, PackedLinear) and m.quantized)


def int8_count(model: nn.Module) -> int:
    """How many of ``model``'s packed linears run on integer panels (``"panel_int8"``)."""
    return sum(1 for m in model.modules() if isinstance(m, PackedLinear) and m.int8)


def narrow_count(model: nn.Module) -> int:
    """How many of ``model``'s packed linears run on narrow integer panels (every q at most
    ``qdot.narrow_max()``: 4-bit weights, which qdot's AVX2 kernels run 12 rows at a time)."""
    return sum(1 for m in model.modules() if isinstance(m, PackedLinear) and m._narrow)


def half_panels() -> bool:
    """Whether qdot's AVX2 kernels run passes of 2 rows or more on half panels (narrow panels
    12 rows at a time, signed ones up to 7 rows: ``qdot.set_halves``; the same results either
    way)."""
    qdot = _native.load("qdot")
    return bool(qdot is not None and hasattr(qdot, "halves") and qdot.halves())


def use_half_panels(on: bool) -> bool:
    """Run qdot's AVX2 half-panel kernels where they apply (the default; see
    :func:`use_half_panels_from`) or its 3-row blocks throughout: the same results, other
    speeds (for tests and A/B runs). Returns the previous state. Process-wide: cost curves
    measured before no longer describe the kernels."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "set_halves"):
        return False
    return bool(qdot.set_halves(on))


def use_half_panels_from(narrow_rows: int, signed_rows: int) -> tuple[int, int] | None:
    """The smallest AVX2 passes that run the half-panel kernels: ``narrow_rows`` for narrow
    (4-bit) panels, ``signed_rows`` for signed (8-bit) ones; the default ``(2, 2)`` (a
    one-block half-panel pass prefetches the next panel as it computes, the 3-row kernels'
    one-block passes do not: passes of 2-3 nodes 2-8% cheaper), ``(4, 4)`` before session 28.
    The same results, other speeds (for A/B runs). Returns the previous pair, or ``None``
    where qdot is not built. Process-wide, like :func:`use_half_panels`."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "set_halves_from"):
        return None
    return tuple(qdot.set_halves_from(int(narrow_rows), int(signed_rows)))


def int8_vnni() -> bool:
    """Whether ``"panel_int8"`` layers run their AVX512-VNNI kernels (else AVX2 ones)."""
    qdot = _native.load("qdot")
    return bool(qdot is not None and qdot.vnni())


def int8_amx() -> bool:
    """Whether ``"panel_int8"`` passes of :func:`amx_from_rows` rows or more run on AMX tiles
    (the CPU and OS allow them, :func:`use_amx` has not turned them off, and the VNNI kernels
    run)."""
    qdot = _native.load("qdot")
    return bool(qdot is not None and hasattr(qdot, "amx") and qdot.amx())


def use_amx(on: bool) -> bool:
    """Run ``"panel_int8"`` passes of several rows on AMX tiles where the CPU has them (the
    default) or on the VNNI kernels: the same results, other speeds (for tests and A/B
    runs). Returns the previous state. Process-wide; a model's cost curve is kept per
    setting (:func:`structspec.spec.cost.device_cost_curve`)."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "set_amx"):
        return False
    return bool(qdot.set_amx(on))


def amx_from_rows() -> int:
    """The smallest ``"panel_int8"`` passes that run on AMX tiles where :func:`int8_amx` is
    true (6 by default: below it one VNNI block costs less); 0 where qdot has no AMX
    kernels."""
    qdot = _native.load("qdot")
    return int(qdot.amx_from()) if qdot is not None and hasattr(qdot, "amx_from") else 0


def use_amx_from(rows: int) -> int:
    """Run ``"panel_int8"`` passes of ``rows`` rows or more on AMX tiles (where they run): the
    same results, other speeds (for tests and A/B runs). Returns the previous bound (0 where
    qdot has no AMX kernels). Process-wide, like :func:`use_amx`."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "set_amx_from"):
        return 0
    return int(qdot.set_amx_from(int(rows)))


def one_panel_rows() -> tuple[int, int]:
    """The ``"panel_int8"`` passes that the AVX512-VNNI kernels run one weight panel against
    all their rows (blocks of at most 12), as ``(rows_from, rows_to)``: (1, 19) by default.
    The others run two panels against blocks of at most 6 rows, which read the weights once
    per block. On the Zen 4 of session 47 (the default model's body linears, 1 thread): 1-4
    rows 0.85-0.88x the time of two panels (one panel is one sequential stream, which the
    hardware prefetcher follows best alone), 7 rows 0.72x, 8 rows 0.76x, 13-19 rows ~0.98x;
    20 rows or more ran as fast or faster on two panels. (0, 0) where qdot has no such
    kernels."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "one_panel"):
        return (0, 0)
    rows_from, rows_to = qdot.one_panel()
    return (int(rows_from), int(rows_to))


def use_one_panel(rows_from: int, rows_to: int) -> tuple[int, int]:
    """Run ``"panel_int8"`` passes of ``rows_from`` to ``rows_to`` rows one panel at a time on
    the VNNI kernels (``rows_to`` 0: none): the same results, other speeds (for tests and A/B
    runs). Returns the previous pair ((0, 0) where qdot has no such kernels). Process-wide,
    like :func:`use_amx`."""
    qdot = _native.load("qdot")
    if qdot is None or not hasattr(qdot, "set_one_panel"):
        return (0, 0)
    before = qdot.set_one_panel(int(rows_from), int(rows_to))
    return (int(before[0]), int(before[1]))


def avx512() -> bool:
    """Whether the panel kernels run their AVX-512 versions (the CPU has AVX-512F and
    :func:`use_avx512` has not turned them off)."""
    gemm = _native.load("smallgemm")
    return bool(gemm is not None and hasattr(gemm, "avx512") and gemm.avx512())


def use_avx512(on: bool) -> bool:
    """Run the panel kernels' AVX-512 versions (where the CPU has them) or their AVX2 ones:
    the same results, other speeds (for tests and A/B runs). Returns the previous state.
    Process-wide: cost curves measured before no longer describe the kernels."""
    gemm = _native.load("smallgemm")
    if gemm is None or not hasattr(gemm, "set_avx512"):
        return False
    before = bool(gemm.set_avx512(on))
    _QUANT_MAX[0] = quant_max_rows()
    return before


def quant_max_rows() -> int:
    """The longest pass that reads a layer's exactly quantized panels with the kernels that
    run here (:data:`QUANT_MAX_ROWS`, or :data:`QUANT_MAX_ROWS_AVX512`)."""
    return QUANT_MAX_ROWS_AVX512 if avx512() else QUANT_MAX_ROWS


def cost_steps(model: nn.Module) -> tuple[tuple[int, int], ...] | None:
    """Where the pass cost of ``model``'s packed kernel steps up (:data:`COST_STEPS`, and past
    :data:`QUANT_MAX_ROWS` rows where its layers have exactly quantized panels), or ``None``
    when its linears are not packed or their kernel's blocking is not ours to know
    (oneDNN)."""
    kernel = packed_kernel(model)
    if kernel == "panel_int8" and int8_count(model):
        vnni = int8_vnni()
        if not vnni and half_panels() and narrow_count(model) * 2 > int8_count(model):
            return COST_STEPS_INT8_NARROW
        if vnni and int8_amx():
            return COST_STEPS_INT8_AMX
        return COST_STEPS_INT8[vnni]
    table = COST_STEPS_AVX512 if avx512() else COST_STEPS
    steps = None if kernel is None else table.get(kernel)
    if steps is not None and quantized_count(model):
        # passes of up to quant_max_rows() rows read the quantized panels, one more row the
        # float32 ones: a step of its own (AVX2, 1 thread: 4 rows 1.08x one row, 6 rows 1.53x)
        last = quant_max_rows()
        steps = tuple(sorted({*steps, (last, last)}))
    return steps
