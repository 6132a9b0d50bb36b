"""The ``"panel_int8"`` kernel (``structspec/_native/qdot.c``): exactly quantized layers run
with 8-bit activations, as llama.cpp runs Q4_1. Its numbers are the documented arithmetic
(checked against a NumPy model of it), a row's result is bitwise the same in every pass size
and with either ISA, layers it cannot run keep the lossless panels, and decoding with it —
plain and speculative — emits the same tokens."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import pytest
import torch
from conftest import decode_both, random_tree, run_decode, torch_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from structspec import _native
from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.hf_compat import cache_kwargs
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec import fastlinear as fl
from structspec.spec.block_quant import (
    BLOCK,
    dequantize,
    quantize_q4_1,
    quantize_q8_0,
    recover,
)
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.vocab import Vocabulary

QDOT = _native.load("qdot")
pytestmark = pytest.mark.skipif(
    "panel_int8" not in fl.available_kernels(approx=True),
    reason="the qdot kernel is not built here or the CPU lacks AVX2/FMA/F16C")


@contextlib.contextmanager
def qdot_kernels(isa: str):
    """Run ``isa``'s kernels for the block: ``"avx2"``, ``"vnni"`` (AMX off), ``"vnni-1p"``
    (VNNI, one panel against every pass), ``"vnni-2p"`` (VNNI, two panels against every
    pass), ``"amx"`` (VNNI, with every pass of one row or more on AMX tiles) or ``"amx6"``
    (AMX from 6 rows, the default: a last block of 1-5 rows after full tile blocks runs on
    VNNI); the previous choice is restored afterwards. Skips where the CPU lacks them."""
    tiles = isa.startswith("amx")
    before = QDOT.set_vnni(isa != "avx2"), QDOT.set_amx(tiles)
    rows = QDOT.set_amx_from({"amx": 1, "amx6": 6}.get(isa, QDOT.amx_from()))
    panels = QDOT.set_one_panel(*{"vnni-1p": (1, 10**6), "vnni-2p": (1, 0)}.get(
        isa, QDOT.one_panel()))
    try:
        if isa != "avx2" and not QDOT.vnni():
            pytest.skip("this CPU has no AVX512-VNNI")
        if tiles and not QDOT.amx():
            pytest.skip("this CPU or OS runs no AMX tiles")
        yield
    finally:
        QDOT.set_vnni(before[0])
        QDOT.set_amx(before[1])
        QDOT.set_amx_from(rows)
        QDOT.set_one_panel(*panels)


@pytest.fixture(params=["avx2", "vnni", "vnni-1p", "vnni-2p", "amx", "amx6"])
def qdot_isa(request):
    """Run the test with the AVX2 kernels, the AVX512-VNNI ones and the AMX ones, from one row
    and as by default (each skipped where the CPU has none); the previous choice is restored
    afterwards."""
    with qdot_kernels(request.param):
        yield request.param


def _q4_linear(n: int, k: int, bias: bool, seed: int = 0) -> nn.Linear:
    """An ``nn.Linear`` whose weight is dequantized from Q4_1 (as the default model's body)."""
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).eval()
    w = dequantize(quantize_q4_1(lin.weight.detach().numpy()))
    lin.weight.data = torch.from_numpy(np.ascontiguousarray(w))
    return lin


def _q8_0(weight: np.ndarray) -> np.ndarray:
    """``weight`` rounded as GGUF Q8_0 does (w = d*q per block of 32, q signed, d a half),
    dequantized to float32 — as the default model's tied output layer."""
    return np.ascontiguousarray(dequantize(quantize_q8_0(weight)))


def _q8_linear(n: int, k: int, bias: bool, seed: int = 0) -> nn.Linear:
    """An ``nn.Linear`` whose weight is dequantized from Q8_0."""
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).eval()
    lin.weight.data = torch.from_numpy(_q8_0(lin.weight.detach().numpy()))
    return lin


def _q8_unsigned_linear(n: int, k: int, bias: bool, seed: int = 0) -> nn.Linear:
    """An ``nn.Linear`` whose weight is Q8_0 of non-negative numbers: q in 0..127, no offset —
    unsigned panels too wide for the narrow AVX2 kernels."""
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).eval()
    lin.weight.data = torch.from_numpy(_q8_0(np.abs(lin.weight.detach().numpy())))
    return lin


_MAKERS = {"q4_1": _q4_linear, "q8_0": _q8_linear, "q8_0_unsigned": _q8_unsigned_linear}
#: (signed, narrow) panels each kind packs to
_KINDS = {"q4_1": (False, True), "q8_0": (True, False), "q8_0_unsigned": (False, False)}


@pytest.fixture
def halves_off():
    """Run the AVX2 3-row kernels on every pass (same bits); restored after."""
    before = QDOT.set_halves(False)
    try:
        yield
    finally:
        QDOT.set_halves(before)


def _reference(x: np.ndarray, lin: nn.Linear) -> np.ndarray:
    """The documented arithmetic in NumPy: x rounded to 8 bits per block of 32, integer dot
    products with q, then d, dx and m, sx — in float64 (the kernel rounds in float32)."""
    q = recover(lin.weight.detach().numpy())
    assert q is not None
    m_rows, k = x.shape
    nb = k // BLOCK
    xb = x.reshape(m_rows, nb, BLOCK).astype(np.float32)
    amax = np.abs(xb).max(-1)
    scale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(
        np.float32)
    xq = np.clip(np.rint(xb * scale[..., None]), -127, 127)
    dx = np.where(amax > 0, amax / np.float32(127), 0).astype(np.float32)
    sx = (dx * xq.sum(-1).astype(np.float32)).astype(np.float32)
    qq = q.q.reshape(-1, nb, BLOCK).astype(np.int64)
    isum = np.einsum("mbi,nbi->mnb", xq.astype(np.int64), qq).astype(np.float64)
    d = q.d.astype(np.float64)
    mm = q.m.astype(np.float64)
    out = (isum * d[None] * dx[:, None, :] + mm[None] * sx[:, None, :]).sum(-1)
    if lin.bias is not None:
        out = out + lin.bias.detach().numpy().astype(np.float64)
    return out


@pytest.mark.parametrize("kind", sorted(_MAKERS))
@pytest.mark.parametrize(("n", "k", "bias"), [(80, 64, True), (200, 96, False), (7, 32, True),
                                              (576, 576, False)])
def test_outputs_follow_the_documented_arithmetic(qdot_isa, n, k, bias, kind):
    """Q4_1 (the default model's body, narrow panels), Q8_0 (signed q, no offset: its output
    layer, on the signed kernels) and Q8_0 of non-negative weights (unsigned, q up to 127)
    all give the documented arithmetic."""
    lin = _MAKERS[kind](n, k, bias, seed=n)
    layer = fl.PackedLinear(lin, "panel_int8")
    signed, narrow = _KINDS[kind]
    assert layer.int8 and (layer._signed, layer._narrow) == (signed, narrow)
    assert not layer.quantized
    assert (recover(lin.weight.detach().numpy()).q.min() < 0) == signed
    # 21 rows: a 16-row tile block and 5 rows more (on VNNI where the tiles run from 6)
    x = torch.randn(21, k, generator=torch.Generator().manual_seed(k))
    with torch.inference_mode():
        got = layer(x).double().numpy()
        exact = lin(x).double().numpy()
    want = _reference(x.numpy(), lin)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale  # float32 rounding of the same sums
    # and an approximation of the float32 layer (the activations' rounding, ~0.4%)
    assert np.abs(got - exact).max() <= 2e-2 * np.abs(exact).max()


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 70), blocks=st.integers(1, 5), rows=st.integers(1, 40),
       bias=st.booleans(), seed=st.integers(0, 2**16), threads=st.sampled_from([1, 2]),
       kind=st.sampled_from(sorted(_MAKERS)))
def test_rows_are_bitwise_independent_of_the_pass_and_the_isa(n, blocks, rows, bias, seed,
                                                              threads, kind):
    """A row's outputs are the same bits in a pass of any size, with the AVX2 kernels (the
    narrow ones where the panels allow, or not), the AVX512-VNNI ones and AMX tiles (from
    one row, and from six with a last block of a few rows on VNNI)."""
    k = blocks * BLOCK
    layer = fl.PackedLinear(_MAKERS[kind](n, k, bias, seed), "panel_int8")
    assert layer.int8 and (layer._signed, layer._narrow) == _KINDS[kind]
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) * 3
    narrow_before = QDOT.set_halves(True)
    isas = [("avx2", True), ("avx2", False)] \
        + ([("vnni", True), ("vnni-1p", True), ("vnni-2p", True)] if QDOT.vnni() else []) \
        + ([("amx", True), ("amx6", True)] if QDOT.amx() else [])
    try:
        outs = []
        with torch.inference_mode(), torch_threads(threads):
            for isa, narrow in isas:
                QDOT.set_halves(narrow)
                with qdot_kernels(isa):
                    whole = layer(x)
                    lone = torch.cat([layer(x[i:i + 1]) for i in range(rows)])
                assert torch.equal(whole, lone)
                outs.append(whole)
    finally:
        QDOT.set_halves(narrow_before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 14, 24, 25, 37])
@pytest.mark.parametrize("qmax", [15, 16])
def test_narrow_kernels_give_the_wide_kernels_bits_at_their_limit(rows, qmax, halves_off):
    """The narrow AVX2 kernels add a block's products in int16: at their limit (every q the
    largest they take, activations at +-127 after rounding: a block's constant input) the
    sums stay exact, and the outputs are the wide kernels' bits and the documented
    arithmetic. Panels with a larger q are never narrow."""
    n, k = 40, 8 * BLOCK
    nb = k // BLOCK
    assert QDOT.narrow_max() == 16
    gen = torch.Generator().manual_seed(rows)
    q = torch.full((n, k), qmax, dtype=torch.int8)
    q[::3, ::5] = 0
    d = torch.rand(n, nb, generator=gen) / 8
    m = -torch.rand(n, nb, generator=gen)
    packed = torch.empty(QDOT.packed_bytes(n, k), dtype=torch.uint8)
    assert QDOT.pack(packed.data_ptr(), q.data_ptr(), d.data_ptr(), m.data_ptr(), n, k)
    x = torch.ones(rows, k)
    x[:, BLOCK:2 * BLOCK] = -1.0
    x[::2, 3 * BLOCK:4 * BLOCK] = 0.0
    x[1::3, 5 * BLOCK:] *= -1e4
    x[2::4, 6 * BLOCK] = 0.5  # one block not at the extreme

    def run(narrow: bool) -> torch.Tensor:
        out = torch.empty(rows, n)
        QDOT.linear(x.data_ptr(), rows, k, packed.data_ptr(), n, 0, out.data_ptr(), 1, False,
                    narrow)
        return out

    wide = run(True)  # halves_off: the 3-row kernels whatever the flag says
    QDOT.set_halves(True)
    before = QDOT.set_halves_from(1, 1)  # a 1-row pass on half panels too
    try:
        narrow = run(True)
    finally:
        QDOT.set_halves_from(*before)
    assert torch.equal(wide, narrow)
    xb = x.numpy().reshape(rows, nb, BLOCK).astype(np.float32)
    amax = np.abs(xb).max(-1)
    scale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0)
    xq = np.clip(np.rint(xb * scale.astype(np.float32)[..., None]), -127, 127)
    dx = (amax / np.float32(127)).astype(np.float64)
    isum = np.einsum("rbi,nbi->rnb", xq, q.numpy().reshape(n, nb, BLOCK).astype(np.float64))
    want = (isum * d.numpy()[None] * dx[:, None, :]
            + m.numpy()[None] * (dx * xq.sum(-1))[:, None, :]).sum(-1)
    assert np.abs(narrow.double().numpy() - want).max() <= 1e-5 * np.abs(want).max()


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 90), blocks=st.integers(1, 3), rows=st.integers(1, 20),
       bias=st.booleans(), signed=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_gathered_columns_are_the_whole_pass_bits(n, blocks, rows, bias, signed, seed, data):
    """A column's numbers do not depend on its place among the others: the outputs of a few
    columns' panels (sparse logits) are bitwise the whole layer's, with either ISA."""
    k = blocks * BLOCK
    make = _q8_linear if signed else _q4_linear
    layer = fl.PackedLinear(make(n, k, bias, seed), "panel_int8")
    ids = torch.tensor(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40)))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    for isa in ["avx2"] + (["vnni"] if QDOT.vnni() else []) + (["amx"] if QDOT.amx() else []):
        with qdot_kernels(isa), torch.inference_mode():
            assert torch.equal(fl.gathered_int8(layer, x, ids), layer(x)[:, ids])


@pytest.mark.parametrize("signed", [False, True])
def test_prefetching_the_next_panels_changes_no_bit(qdot_isa, signed):
    """Passes of one and of several row blocks, with and without fetching the next panels
    ahead (a memory hint only), over an odd number of panels (a last group of one)."""
    make = _q8_linear if signed else _q4_linear
    layer = fl.PackedLinear(make(5 * 16 + 3, 96, True, 3), "panel_int8")
    x = torch.randn(20, 96, generator=torch.Generator().manual_seed(4))
    before = QDOT.set_prefetch_next(True)
    try:
        with torch.inference_mode():
            on = [layer(x[:m]) for m in (1, 2, 5, 7, 13, 20)]
            QDOT.set_prefetch_next(False)
            off = [layer(x[:m]) for m in (1, 2, 5, 7, 13, 20)]
    finally:
        QDOT.set_prefetch_next(before)
    assert all(torch.equal(a, b) for a, b in zip(on, off, strict=True))


def test_amx_switches_round_trip_and_keep_the_bits():
    """``use_amx`` / ``use_amx_from`` return the previous setting and ``int8_amx`` /
    ``amx_from_rows`` report the current one; a layer gives the same bits either way."""
    layer = fl.PackedLinear(_q4_linear(40, 64, True, 5), "panel_int8")
    x = torch.randn(19, 64, generator=torch.Generator().manual_seed(5))
    before, rows = fl.use_amx(False), fl.amx_from_rows()
    try:
        assert not fl.int8_amx()
        with torch.inference_mode():
            off = layer(x)
        assert fl.use_amx(True) is False
        assert fl.int8_amx() == bool(QDOT.amx())
        if fl.int8_amx():
            assert rows == 6 and fl.use_amx_from(2) == 6 and fl.amx_from_rows() == 2
        with torch.inference_mode():
            assert torch.equal(layer(x), off)
    finally:
        fl.use_amx(before)
        if rows:
            fl.use_amx_from(rows)
    with pytest.raises(ValueError, match="rows must be >= 1"):
        QDOT.set_amx_from(0)


def test_one_panel_switch_round_trips_and_keeps_the_bits():
    """``use_one_panel`` returns the previous range and ``one_panel_rows`` reports the current
    one; passes of every size either side of the range's ends give the same bits with one
    panel, two panels or the default split (signed and offset panels, 1 and 2 threads)."""
    before = fl.one_panel_rows()
    assert before == (1, 19)
    x = torch.randn(26, 96, generator=torch.Generator().manual_seed(7))
    try:
        for kind in ("q4_1", "q8_0"):
            layer = fl.PackedLinear(_MAKERS[kind](50, 96, True, 7), "panel_int8")
            with torch.inference_mode():
                for threads in (1, 2):
                    with torch_threads(threads):
                        outs = []
                        for rows in ((1, 19), (1, 0), (1, 10**6)):
                            fl.use_one_panel(*rows)
                            assert fl.one_panel_rows() == rows
                            outs.append([layer(x[:m]) for m in range(1, 27)])
                        for other in outs[1:]:
                            assert all(torch.equal(a, b) for a, b in zip(outs[0], other))
    finally:
        assert fl.use_one_panel(*before) == (1, 10**6)
    assert fl.one_panel_rows() == before
    with pytest.raises(ValueError, match="rows_from must be >= 1"):
        QDOT.set_one_panel(0, 5)


def test_gather_refuses_ids_out_of_range():
    layer = fl.PackedLinear(_q8_linear(20, 32, False), "panel_int8")
    with pytest.raises(IndexError, match="out of range"):
        fl.gathered_int8(layer, torch.randn(2, 32), torch.tensor([3, 20]))
    with pytest.raises(ValueError, match="integer panels"):
        fl.gathered_int8(fl.PackedLinear(nn.Linear(32, 4), "panel_int8"), torch.randn(1, 32),
                         torch.tensor([0]))


_AWKWARD = st.sampled_from([0.0, -0.0, 1e-30, -1e-38, 1e-45, 3.4e38, -3.4e38, 0.5, -0.5,
                            1.5, 2.5, -2.5, 127.0, float("inf"), float("-inf"), float("nan")])


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), blocks=st.integers(1, 4), seed=st.integers(0, 2**16),
       awkward=st.lists(st.tuples(st.integers(0, 10**6), _AWKWARD), max_size=12),
       spread=st.sampled_from([1e-3, 1.0, 1e3]))
def test_vector_rounding_of_activations_is_the_plain_loop_bit_for_bit(rows, blocks, seed,
                                                                       awkward, spread):
    """The vector quantization (the default) and the plain loop it replaced give the same
    outputs bit for bit — halfway cases, zero and non-finite blocks, subnormals included."""
    k = blocks * BLOCK
    layer = fl.PackedLinear(_q4_linear(24, k, False, seed % 7), "panel_int8")
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) * spread
    flat = x.view(-1)
    for where, value in awkward:
        flat[where % flat.numel()] = value
    before = QDOT.set_vector_quantize(True)
    try:
        with torch.inference_mode():
            vector = layer(x)
            QDOT.set_vector_quantize(False)
            plain = layer(x)
    finally:
        QDOT.set_vector_quantize(before)
    assert vector.view(torch.int32).equal(plain.view(torch.int32))  # NaNs compared by bits


def test_zero_rows_and_blocks_and_batched_shapes():
    layer = fl.PackedLinear(_q4_linear(40, 64, True), "panel_int8")
    with torch.inference_mode():
        assert layer(torch.empty(0, 64)).shape == (0, 40)
        x = torch.zeros(2, 3, 64)
        x[0, 1, 32:] = torch.randn(32)  # a zero block beside a live one
        out = layer(x)
        assert out.shape == (2, 3, 40)
        assert torch.equal(out[1, 0], layer.original.bias.detach())  # zeros: the bias alone
        assert torch.equal(out[0, 1], layer(x[0, 1:2])[0])


@pytest.mark.parametrize("signed", [False, True])
def test_int8_rows_gives_forwards_bits_and_refuses_layers_without_integer_panels(signed):
    """``PackedLinear.int8_rows`` (the draft head's call, without ``forward``'s checks): the
    same bits as ``forward`` for any row count, zero included; a layer that does not run on
    integer panels is refused with a ``ValueError`` that names the requirement."""
    make = _q8_linear if signed else _q4_linear
    layer = fl.PackedLinear(make(40, 64, True, 3), "panel_int8")
    with torch.inference_mode():
        for rows in (0, 1, 7, 13):
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
            assert torch.equal(layer.int8_rows(x), layer(x))
    lossless = fl.PackedLinear(nn.Linear(48, 10).eval(), "panel_int8")
    with pytest.raises(ValueError, match="integer panels"), torch.inference_mode():
        lossless.int8_rows(torch.randn(2, 48))
    panels, out, bias, sgn, _ = layer.native_args()  # what a native caller passes
    assert panels and out == 40 and bias == layer._bias.data_ptr() and sgn == signed
    with pytest.raises(ValueError, match="integer panels"):
        lossless.native_args()


def test_layers_it_cannot_run_keep_the_lossless_panels():
    float_layer = nn.Linear(64, 30).eval()  # not block-quantized
    odd = _q4_linear(10, 64, False)  # Q4_1, but k = 48 would not be a multiple of 32:
    odd48 = nn.Linear(48, 10).eval()
    for lin in (float_layer, odd48):
        packed, panel = fl.PackedLinear(lin, "panel_int8"), fl.PackedLinear(lin, "panel")
        assert not packed.int8
        x = torch.randn(5, lin.in_features)
        with torch.inference_mode():
            assert torch.equal(packed(x), panel(x))
    assert fl.PackedLinear(odd, "panel_int8").int8
    assert "int8-activations" in repr(fl.PackedLinear(odd, "panel_int8"))
    assert fl.PackedLinear(_q8_linear(12, 64, False), "panel_int8").int8  # signed kernels
    assert fl.narrow_count(fl.pack_linears(
        nn.Sequential(_q4_linear(8, 64, False), _q8_linear(8, 8 * 8, False)),
        "panel_int8")) == 1


def test_rounded_int8_runs_a_float_layer_on_integer_panels_and_leaves_it_unchanged():
    """A float32 layer (no block structure) rounded to Q8_0 for a drafter: it runs on the
    integer kernel within the rounding's error of the float layer, equals the kernel run on
    the rounded weight, keeps the unrounded layer as its original (state_dict, autograd), and
    is refused where the input width is not a multiple of 32."""
    torch.manual_seed(3)
    lin = nn.Linear(96, 40).eval()
    before = lin.weight.detach().clone()
    packed = fl.rounded_int8(lin)
    assert packed is not None and packed.int8 and packed.original is lin
    assert torch.equal(lin.weight, before)
    assert torch.equal(packed.state_dict()["original.weight"], before)
    rounded = nn.Linear(96, 40).eval()
    with torch.no_grad():
        rounded.weight.copy_(torch.from_numpy(_q8_0(before.numpy())))
        rounded.bias.copy_(lin.bias)
    x = torch.randn(3, 96)
    with torch.inference_mode():
        got = packed(x)
        assert torch.equal(got, fl.PackedLinear(rounded, "panel_int8")(x))
        torch.testing.assert_close(got, lin(x), atol=0.02, rtol=0.02)
    with torch.enable_grad():
        torch.testing.assert_close(packed(x), lin(x))  # autograd: the original layer
    twin = copy.deepcopy(packed)  # rounded again from its own copy of the original
    assert twin.int8 and twin.original is not lin
    with torch.inference_mode():
        assert torch.equal(twin(x), got)
    assert fl.rounded_int8(nn.Linear(48, 8)) is None


def test_pack_refuses_negative_q_and_bad_shapes():
    n, k = 4, 32
    q = torch.zeros(n, k, dtype=torch.int8)
    q[1, 3] = -1
    d, m = torch.ones(n, 1), torch.zeros(n, 1)
    dst = torch.empty(QDOT.packed_bytes(n, k), dtype=torch.uint8)
    assert not QDOT.pack(dst.data_ptr(), q.data_ptr(), d.data_ptr(), m.data_ptr(), n, k)
    with pytest.raises(ValueError, match="pack_signed"):  # no offsets: the signed packer's
        QDOT.pack(dst.data_ptr(), q.data_ptr(), d.data_ptr(), 0, n, k)
    with pytest.raises(ValueError, match="multiple of 32"):
        QDOT.packed_bytes(4, 48)
    with pytest.raises(ValueError, match="multiple of 32"):
        QDOT.linear(0, 1, 48, 0, 4, 0, 0, 1)


def test_fast_cpu_paths_choose_it_and_pack_linears_does_not():
    model = nn.Sequential(_q4_linear(32, 64, True), nn.ReLU(), nn.Linear(32, 16))
    lossless = fl.pack_linears(copy.deepcopy(model))
    assert fl.packed_kernel(lossless) == "panel" and fl.int8_count(lossless) == 0
    assert "panel_int8" not in fl.available_kernels()
    exact = use_fast_cpu_paths(copy.deepcopy(model), int8_activations=False)
    assert fl.int8_count(exact) == 0
    approx = use_fast_cpu_paths(copy.deepcopy(model))
    assert fl.int8_count(approx) == 1  # the Q4_1 layer; the float32 one keeps its panels
    # the AVX2 kernels run the Q4_1 layer's narrow panels in blocks of 7, not 3
    assert fl.narrow_count(approx) == 1
    assert fl.cost_steps(approx) == (fl.COST_STEPS_INT8[True] if fl.int8_vnni()
                                     else fl.COST_STEPS_INT8_NARROW)
    before = fl.use_half_panels(False)
    try:
        assert not fl.half_panels()
        assert fl.cost_steps(approx) == fl.COST_STEPS_INT8[fl.int8_vnni()]
    finally:
        assert fl.use_half_panels(before) is False
    assert fl.half_panels() == before
    previous = fl.use_half_panels_from(4, 4)  # the thresholds before session 28
    try:
        assert previous == (2, 2)
        x = torch.randn(3, 64)
        with torch.inference_mode():
            legacy = approx[0](x)
            fl.use_half_panels_from(*previous)
            assert torch.equal(approx[0](x), legacy)  # the same bits, other kernels
    finally:
        fl.use_half_panels_from(*previous)
    with pytest.raises(ValueError, match=">= 1"):
        fl.use_half_panels_from(0, 1)
    restored = fl.unpack_linears(approx)
    assert type(restored[0]) is nn.Linear
    copied = copy.deepcopy(use_fast_cpu_paths(copy.deepcopy(model)))
    assert fl.int8_count(copied) == 1


PATTERNS = {
    "call": (r'\{"name":"(get_weather|get_time)","arguments":\{"city":"[A-Za-z ]{1,12}",'
             r'"days":[0-9]{1,2}(,"unit":"(celsius|fahrenheit)")?\}\}'),
    "digits": r"[0-9]{1,6}",
}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "{"]


@pytest.fixture(scope="module")
def int8_tiny(tiny_model):
    """The tiny Llama with Q4_1 body weights and a Q8_0 output layer (as the default
    model), run with 8-bit activations."""
    model = copy.deepcopy(tiny_model.model)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if type(mod) is nn.Linear:
                w = mod.weight.detach().numpy()
                w = _q8_0(w) if name == "lm_head" else dequantize(quantize_q4_1(w))
                mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
    use_fast_cpu_paths(model)
    assert fl.int8_count(model) >= 15  # 2 layers x 7 body linears, and the output layer
    assert model.get_output_embeddings()._signed
    tok = tiny_model.tokenizer
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {k: compile_regex(v, vocab) for k, v in PATTERNS.items()}
    constraints["free"] = free_text(vocab)
    return model, tok, vocab, constraints


@pytest.mark.usefixtures("one_thread")
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
       name=st.sampled_from(sorted([*PATTERNS, "free"])))
def test_speculative_greedy_emits_what_plain_greedy_emits(int8_tiny, words, name):
    """Token for token: the rounding is a function of each row's own numbers, and those are
    bitwise the same in tree and 1-row passes (packed linears, row-exact attention)."""
    model, tok, vocab, constraints = int8_tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    sampling = SamplingParams()
    c = constraints[name]
    plain = run_decode(decode, model, vocab, prompt, c, max_new_tokens=24, sampling=sampling)
    spec = run_decode(speculative_decode, model, vocab, prompt, c, max_new_tokens=24,
                      sampling=sampling, tokenizer=tok, config=SpecConfig())
    assert plain[:3] == spec[:3]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("seed", range(3))
def test_tree_logits_are_bitwise_the_sequential_logits(int8_tiny, seed):
    import random

    from transformers import DynamicCache

    from structspec.spec.verify import verify_tree

    model = int8_tiny[0]
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    cached = [rng.randrange(100, vocab) for _ in range(rng.randrange(2, 30))]
    tree = random_tree(rng, rng.randrange(2, 18), vocab)
    n = len(tree)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([cached]), **cache_kwargs(model, cache), use_cache=True)
        logits = verify_tree(model, cache, tree, len(cached))
        for i in range(n):
            steps = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([cached]), **cache_kwargs(model, steps), use_cache=True)
            for tok in [tree.tokens[j] for j in tree.path(i)]:
                row = model(input_ids=torch.tensor([[tok]]), **cache_kwargs(model, steps),
                            use_cache=True).logits[0, -1]
            assert torch.equal(logits[i], row), i


@pytest.mark.usefixtures("one_thread")
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
       name=st.sampled_from(sorted(PATTERNS)))
def test_sparse_logits_serve_an_output_layer_on_integer_panels(int8_tiny, words, name):
    """The output layer runs the signed kernels; logits gathered from a few of its columns
    are its whole rows' bits, so decoding with sparse logits emits the same tokens."""
    from structspec.spec import sparse_logits

    model, tok, vocab, constraints = int8_tiny
    head = model.get_output_embeddings()
    assert head.int8 and sparse_logits.supports(model)
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    sampling = SamplingParams()
    c = constraints[name]
    runs = []
    for sparse in (True, False):
        plain, spec = decode_both(model, vocab, tok, prompt, c, sampling, sparse_logits=sparse)
        runs.append((plain[:3], spec[:3]))
    assert runs[0] == runs[1] and runs[0][0] == runs[0][1]
