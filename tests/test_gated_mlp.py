"""The gated MLP's activation as one native loop (``structspec/_native/gated.c`` via
``structspec.spec.gated_mlp``): bitwise torch's ``silu(g) * u``, each element computed the
same in any pass (AVX2 and AVX-512 loops alike, a row the same alone or among others),
installed only where the MLP's own forward gives the same bits."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec import _native
from structspec.spec import gated_mlp

KERNEL = _native.runnable("gated")
pytestmark = pytest.mark.skipif(KERNEL is None,
                                reason="the gated kernel is not built here or the CPU lacks AVX2")


def _fused(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    out = g.clone()
    KERNEL.silu_mul(out.data_ptr(), u.data_ptr(), out.numel())
    return out


def _both_loops(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    before = KERNEL.set_wide(True)
    try:
        wide = _fused(x, u)
        KERNEL.set_wide(False)
        return wide, _fused(x, u)
    finally:
        KERNEL.set_wide(before)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 20), scale=st.sampled_from([0.1, 1.0, 8.0, 60.0, 150.0]),
       seed=st.integers(0, 2**16))
def test_bitwise_torch_on_both_loops(rows, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x, u = torch.randn(rows, 64, generator=g) * scale, torch.randn(rows, 64, generator=g)
    want = torch.nn.functional.silu(x) * u
    for got in _both_loops(x, u):
        assert torch.equal(got, want)


def test_bitwise_torch_over_a_sweep_of_all_floats():
    # every 4099th bit pattern (~1M floats: subnormals, both signs, the range limits, inf)
    bits = torch.arange(0, 2**32, 4099, dtype=torch.int64)
    x = (bits - 2**31).to(torch.int32).view(torch.float32)
    x = x[~torch.isnan(x)]
    x = x[: x.numel() // 16 * 16]  # torch's own tail runs std::exp (see gated.c)
    u = torch.linspace(-3, 3, x.numel())
    want = torch.nn.functional.silu(x) * u
    for got in _both_loops(x, u):
        assert torch.equal(got, want)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 70), seed=st.integers(0, 2**16))
def test_any_length_runs_the_vector_path_throughout(n, seed):
    g = torch.Generator().manual_seed(seed)
    x, u = torch.randn(n, generator=g) * 5, torch.randn(n, generator=g)
    padded = torch.zeros(80), torch.zeros(80)
    padded[0][:n], padded[1][:n] = x, u
    wide, narrow = _both_loops(x, u)
    assert torch.equal(wide, narrow)
    assert torch.equal(wide, _fused(*padded)[:n])  # a tail element = the same in a full vector


def test_a_row_is_the_same_alone_and_among_others():
    g = torch.Generator().manual_seed(3)
    x, u = torch.randn(12, 100, generator=g) * 5, torch.randn(12, 100, generator=g)
    many = _fused(x, u)
    for r in range(12):
        assert torch.equal(many[r], _fused(x[r].clone(), u[r].clone()))


def test_extremes():
    x = torch.tensor([-1e4, -100.0, -88.0, -1e-3, -0.0, 0.0, 1e-3, 88.0, 100.0, 1e4,
                      float("inf"), float("-inf")])
    got = _fused(x, torch.ones_like(x))
    want = torch.nn.functional.silu(x)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-30, equal_nan=True)  # silu(-inf): nan
    assert torch.isnan(_fused(torch.tensor([float("nan")]), torch.ones(1))).all()


def test_models_mlps_use_it_and_give_the_same_logits(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    ids = torch.tensor([[5, 17, 300, 41, 9, 2000]])
    with torch.inference_mode():
        before = model(ids).logits
        assert gated_mlp.use_fused_activation(model) == 2
        assert gated_mlp.use_fused_activation(model) == 2  # idempotent
        after = model(ids).logits
    assert gated_mlp.fused_count(model) == 2
    assert torch.equal(before, after)
    gated_mlp.restore_activation(model)
    assert gated_mlp.fused_count(model) == 0


def test_an_mlp_of_another_activation_is_left_alone(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    for layer in model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    assert gated_mlp.use_fused_activation(model) == 0


def test_autograd_takes_torchs_path(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    gated_mlp.use_fused_activation(model)
    out = model(torch.tensor([[5, 17, 300]])).logits
    out.sum().backward()  # the fused loop is inference-only: this must not touch it
    assert model.model.layers[0].mlp.gate_proj.weight.grad is not None


@pytest.mark.real_model
def test_glue_ab_benchmark_runs(tmp_path):
    """``benchmarks/glue_ab.py`` (a smoke run: two pass sizes, one round; the script checks
    that the logits are bitwise the same with and without the native glue)."""
    import json

    from conftest import load_benchmark, torch_threads

    bench = load_benchmark("glue_ab.py")
    out = tmp_path / "glue.json"
    with torch_threads(torch.get_num_threads()):  # the benchmark sets its own count
        assert bench.main(["--nodes", "1,3", "--rounds", "1", "--context", "8",
                           "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["bitwise"] and [r["nodes"] for r in result["rows"]] == [1, 3]


def test_a_negative_length_is_refused_by_the_kernel():
    with pytest.raises(ValueError, match="negative length"):
        KERNEL.silu_mul(0, 0, -1)
