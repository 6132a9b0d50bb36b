"""Packed linears (``structspec.spec.fastlinear``): both kernels match ``nn.Linear``; the panel
kernel gives every row bitwise the same result whatever the number of rows in the pass."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from conftest import load_benchmark, torch_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structspec.spec.fastlinear import (
    COST_STEPS,
    KERNELS,
    PackedLinear,
    available_kernels,
    int8_amx,
    int8_vnni,
    pack_linears,
    packed_kernel,
    packing_available,
    unpack_linears,
)

HAVE = available_kernels()
panel = pytest.mark.skipif("panel" not in HAVE,
                           reason="panel kernel not built here or the CPU lacks AVX2/FMA")


def _linear(k: int, n: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias).eval()


@pytest.mark.parametrize("kernel", HAVE)
@pytest.mark.parametrize(("k", "n", "bias"), [(576, 192, False), (37, 50, True), (16, 1, True),
                                              (5, 33, False)])
def test_kernels_match_nn_linear(kernel, k, n, bias):
    lin = _linear(k, n, bias)
    packed = PackedLinear(lin, kernel)
    x = torch.randn(2, 7, k)
    with torch.inference_mode():
        got, ref = packed(x), lin(x)
    assert got.shape == ref.shape == (2, 7, n)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)


@panel
@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 300), n=st.integers(1, 70), rows=st.integers(1, 80),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_panel_rows_are_bitwise_independent_of_the_pass(k, n, rows, bias, seed):
    """Row i of a pass of ``rows`` rows equals a pass of row i alone, bit for bit, and each
    row is within float32 rounding of the float64 product (1 row, 2-5, 6-64 packed into
    blocks, 65+: each path of the kernel)."""
    lin = _linear(k, n, bias, seed)
    packed = PackedLinear(lin, "panel")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    with torch.inference_mode():
        full = packed(x)
        for i in {0, rows // 2, rows - 1}:
            assert torch.equal(packed(x[i:i + 1]), full[i:i + 1])
    ref = x.double() @ lin.weight.double().T + (0 if lin.bias is None else lin.bias.double())
    assert (full.double() - ref).abs().max().item() < 1e-4 * (1 + k ** 0.5)


@panel
def test_panel_handles_no_rows_and_non_contiguous_input():
    lin = _linear(40, 24, True)
    packed = PackedLinear(lin, "panel")
    with torch.inference_mode():
        assert packed(torch.empty(0, 40)).shape == (0, 24)
        x = torch.randn(40, 6).T  # non-contiguous [6, 40]
        assert torch.allclose(packed(x), lin(x), atol=1e-5)


@pytest.mark.parametrize("kernel", HAVE)
def test_autograd_falls_back_to_the_original(kernel):
    lin = _linear(8, 4, True)
    packed = PackedLinear(lin, kernel)
    x = torch.randn(3, 8, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown linear kernel 'fast'"):
        PackedLinear(_linear(4, 4, False), "fast")
    with pytest.raises(ValueError, match="does not run here"):
        pack_linears(nn.Sequential(_linear(4, 4, False)), "fast")
    assert set(HAVE) <= set(KERNELS)


def test_native_switch_off_disables_the_panel_kernel(monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_NATIVE", "off")
    assert "panel" not in available_kernels()


@pytest.mark.skipif(not HAVE, reason="no packing kernel runs here")
def test_pack_linears_uses_the_best_kernel_and_unpacks():
    model = nn.Sequential(_linear(12, 20, True), nn.ReLU(), _linear(20, 3, False))
    x = torch.randn(5, 12)
    with torch.inference_mode():
        ref = model(x)
        assert packing_available(model)
        pack_linears(model)
        assert packed_kernel(model) == HAVE[0]
        pack_linears(model)  # idempotent
        assert all(type(m).__name__ != "Linear" for m in model)
        assert torch.allclose(model(x), ref, atol=1e-5)
    unpack_linears(model)
    assert packed_kernel(model) is None
    with torch.inference_mode():
        assert torch.equal(model(x), ref)


half = pytest.mark.skipif("panel_f16" not in available_kernels(lossy=True),
                          reason="half-precision panels need the native kernel and F16C")


@half
@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 200), n=st.integers(1, 50), rows=st.integers(1, 20),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_half_panels_compute_in_float32_on_rounded_weights(k, n, rows, bias, seed):
    """``panel_f16`` equals, bit for bit, the float32 panel kernel on the weights rounded to
    half precision; rows stay independent of the pass."""
    lin = _linear(k, n, bias, seed)
    rounded = _linear(k, n, bias, seed)
    with torch.no_grad():
        rounded.weight.copy_(lin.weight.half().float())
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        got = PackedLinear(lin, "panel_f16")(x)
        assert torch.equal(got, PackedLinear(rounded, "panel")(x))
        assert torch.equal(PackedLinear(lin, "panel_f16")(x[-1:]), got[-1:])


@half
def test_lossy_kernel_is_never_the_default():
    model = nn.Sequential(_linear(8, 8, False))
    pack_linears(model)
    assert packed_kernel(model) in KERNELS
    assert "panel_f16" not in available_kernels()
    unpack_linears(model)
    pack_linears(model, "panel_f16")
    assert packed_kernel(model) == "panel_f16"


@pytest.mark.parametrize("kernel", HAVE)
def test_packed_model_deep_copies(kernel):
    import copy

    model = nn.Sequential(_linear(8, 5, True))
    pack_linears(model, kernel)
    twin = copy.deepcopy(model)
    x = torch.randn(3, 8)
    with torch.inference_mode():
        assert torch.equal(twin(x), model(x))


def test_linear_kernels_benchmark_runs(tmp_path):
    """``benchmarks/linear_kernels.py`` (a smoke run: two pass sizes, one sweep each)."""
    import json

    bench = load_benchmark("linear_kernels.py")
    out = tmp_path / "lk.json"
    with torch_threads(torch.get_num_threads()):  # the benchmark sets its own count
        assert bench.main(["--rows", "1,3", "--repeats", "1", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    int8 = ["int8"] if "panel_int8" in available_kernels(approx=True) else []
    if int8 and not int8_vnni():  # the AVX2 half panels against the 3-row blocks
        int8.append("int8-3row")
    if int8 and int8_vnni() and not int8_amx():  # one panel against two
        int8.append("int8-2panel")
    assert set(result["ms"]) == {"plain", *HAVE, *(["panel+q"] if "panel" in HAVE else []),
                                 *int8}
    assert all(set(v) == {"1", "3"} for v in result["ms"].values())


@panel
def test_kernel_ab_benchmark_runs(tmp_path):
    """``benchmarks/kernel_ab.py`` (a smoke run: the built module against the working tree's
    source compiled by the script, two pass sizes, one round; the script checks the bits)."""
    import json

    from structspec import _native

    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler to build the kernel with")
    bench = load_benchmark("kernel_ab.py")
    out = tmp_path / "ab.json"
    built = _native.load("smallgemm").__file__
    assert bench.main(["--old-so", built, "--rows", "1,7", "--rounds", "1", "--no-head",
                       "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"1", "7"}
    assert all(v["rounds"] == 1 for v in result["rows"].values())
    # On the exactly quantized panels, with the AVX2 kernels (bits checked against the
    # float32 panels too).
    assert bench.main(["--old-so", built, "--new-so", built, "--rows", "2,9", "--rounds", "1",
                       "--no-head", "--quantized", "--no-avx512", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["quantized"] and not result["avx512"] and set(result["rows"]) == {"2", "9"}


@panel
def test_native_kernel_refuses_bad_shapes():
    from structspec import _native

    gemm = _native.load("smallgemm")
    with pytest.raises(ValueError, match="n and k must be positive"):
        gemm.pack(0, 0, 0, 4)
    with pytest.raises(ValueError, match="bad shape"):
        gemm.linear(0, -1, 4, 0, 4, 0, 0, 1)
    with pytest.raises(TypeError):
        gemm.linear("x", 1, 4, 0, 4, 0, 0, 1)


def test_row_blocks_match_the_native_kernels_rows():
    """``COST_STEPS`` restates ``ROWS`` of ``smallgemm.c`` and its block plan (the cost curve
    is measured either side of each step); they must not drift apart."""
    import re
    from pathlib import Path

    import structspec

    source = (Path(structspec.__file__).parent / "_native" / "smallgemm.c").read_text()
    rows = int(re.search(r"^#define ROWS (\d+)$", source, re.M).group(1))
    assert set(COST_STEPS) == {"panel", "panel_f16"}
    for kernel, steps in COST_STEPS.items():
        assert [b for b, _ in steps] == [rows * j for j in range(1, len(steps) + 1)]
        # 6+1 is one 7-row block for float32 panels only; 6+6+2 is 6+4+4 for both.
        assert [last - b for b, last in steps] == ([1, 2, 2] if kernel == "panel" else [0, 2, 2])
    plan = "(plan.sixes > 0 && plan.tail[0] == 1 && have7) || (plan.sixes > 1 && plan.tail[0] == 2)"
    assert plan in source
    # The AVX-512 kernels: float32 rows in blocks of at most SZ_ROWS, quantized panels up to
    # SZ_QMAX rows.
    from structspec.spec.fastlinear import COST_STEPS_AVX512, QUANT_MAX_ROWS_AVX512

    wide = int(re.search(r"^#define SZ_ROWS (\d+)", source, re.M).group(1))
    assert COST_STEPS_AVX512["panel"] == ((wide, wide), (2 * wide, 2 * wide))
    assert int(re.search(r"^#define SZ_QMAX (\d+)", source, re.M).group(1)) == \
        QUANT_MAX_ROWS_AVX512


@panel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("k", [40, 96, 200])
def test_every_block_plan_gives_each_row_the_bits_of_a_lone_row(threads, half, k):
    """Passes whose rows split into 6-row blocks and a 7-row block, 4+4, or leftovers (every
    size from 1 to 70, across the packed-x range 6-64 and beyond) give every row bitwise what
    a pass of that row alone gives, with one thread or two, and whether the kernel takes the
    input features in one chunk of 64 or in several, the last one short (k = 40, 96, 200)."""
    kernel = "panel_f16" if half else "panel"
    if kernel not in available_kernels(lossy=True):
        pytest.skip(f"{kernel} does not run here")
    lin = _linear(k, 80, True, seed=3)  # 5 panels: uneven across two threads
    packed = PackedLinear(lin, kernel)
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(4))
    with torch_threads(threads), torch.inference_mode():
        alone = torch.cat([packed(x[i:i + 1]) for i in range(70)])
        for rows in range(1, 71):
            assert torch.equal(packed(x[:rows]), alone[:rows]), rows
