"""Packed layers without their original weights (``release_original``, ``release_originals``):
the panels give each weight back bit for bit, so outputs, ``state_dict``, copies, moves,
autograd and ``unpack_linears`` see what a layer that kept its original sees."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import q4_llama
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structspec.spec import cpu_paths, fastlinear
from structspec.spec.block_quant import dequantize, quantize_q4_1, quantize_q8_0
from structspec.spec.fastlinear import (
    PackedLinear,
    available_kernels,
    release_originals,
    unpack_linears,
)

PANEL = "panel" in available_kernels()
INT8 = "panel_int8" in available_kernels(approx=True)
needs_panel = pytest.mark.skipif(not PANEL, reason="the panel kernel does not run here")

KINDS = ["float"] + (["q4_1", "q8_0"] if INT8 else [])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _layer(kind: str, k: int, n: int, bias: bool, seed: int) -> tuple[nn.Linear, PackedLinear]:
    """A linear of ``kind``'s weights and its packed twin: ``float`` on float32 panels,
    ``q4_1`` (offsets, q >= 0) and ``q8_0`` (signed, no offsets) on integer panels."""
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias).eval()
    with torch.no_grad():
        weight = torch.randn(n, k, generator=gen) * 0.05
        if kind == "q4_1":
            weight = torch.from_numpy(dequantize(quantize_q4_1(weight.numpy())))
        elif kind == "q8_0":
            weight = torch.from_numpy(dequantize(quantize_q8_0(weight.numpy())))
        linear.weight.copy_(weight)
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    kernel = "panel" if kind == "float" else "panel_int8"
    packed = PackedLinear(linear, kernel, quantized=False)
    assert kind == "float" or packed.int8
    return linear, packed


@needs_panel
@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(KINDS), blocks=st.integers(1, 6), n=st.integers(1, 70),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_a_released_layer_keeps_its_outputs_and_gives_its_weight_back(kind, blocks, n, bias,
                                                                        seed):
    k = 32 * blocks
    linear, packed = _layer(kind, k, n, bias, seed)
    _, twin = _layer(kind, k, n, bias, seed)  # the same, original kept
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        before = packed(x)
    weight, bias_param = linear.weight.detach().clone(), linear.bias
    assert packed.release_original() and packed.released
    assert packed.release_original()  # again: nothing more to do
    assert "released" in repr(packed)
    with torch.no_grad():
        assert torch.equal(packed(x), before)
    assert torch.equal(_bits(packed.dense_weight()), _bits(weight))
    ids = torch.tensor(sorted({0, n - 1, n // 2}))
    assert torch.equal(_bits(packed.weight_rows(ids)), _bits(weight[ids]))
    # state_dict: the keys and bits of a layer that kept its original
    mine, theirs = packed.state_dict(), twin.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(_bits(mine[key]), _bits(theirs[key])) for key in mine)
    # autograd falls back to the original, rebuilt: the same as the twin's fallback
    assert torch.equal(packed(x), twin(x))
    assert not packed.released and packed.original.bias is bias_param
    assert torch.equal(_bits(packed.original.weight), _bits(weight))


@needs_panel
@pytest.mark.parametrize("kind", KINDS)
def test_copies_moves_and_loads_of_a_released_layer(kind):
    linear, packed = _layer(kind, 64, 40, True, 3)
    weight = linear.weight.detach().clone()
    x = torch.randn(2, 64)
    with torch.no_grad():
        expected = packed(x)
    assert packed.release_original()
    twin = copy.deepcopy(packed)  # packed again from a rebuilt original
    assert packed.released and not twin.released
    with torch.no_grad():
        assert torch.equal(twin(x), expected)
    # a state dict naming the layer brings the original back, and it loads as one held does
    packed.load_state_dict(twin.state_dict())
    assert not packed.released and torch.equal(_bits(packed.original.weight), _bits(weight))
    assert packed.release_original()
    packed.share_memory()  # changes no device or dtype: stays released
    assert packed.released
    wide = packed.to(torch.float64)  # a move brings the original back, and moves it
    assert not wide.released and wide.original.weight.dtype == torch.float64
    assert torch.equal(wide.original.weight, weight.double())


@needs_panel
def test_layers_whose_panels_do_not_hold_the_weight_keep_it():
    """Half-precision panels and a drafter's rounded copy round the weight: the original
    stays (nothing could rebuild it)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 24)
    if "panel_f16" in available_kernels(lossy=True):
        half = PackedLinear(linear, "panel_f16")
        assert not half.releasable() and not half.release_original() and not half.released
        with pytest.raises(ValueError, match="do not hold its weight exactly"):
            half._rebuild()
    rounded = fastlinear.rounded_int8(linear)
    if rounded is not None:
        assert not rounded.release_original() and rounded.original is linear


@pytest.mark.skipif(not INT8, reason="the integer kernels do not run here")
def test_release_originals_skips_tied_and_file_backed_weights(monkeypatch):
    """A tied output layer shares the input embedding (releasing it frees nothing); weights
    mapped from a file are the OS's page cache. The rest go, and the model's logits, state
    dict and unpacked form stay what they were."""
    reference = q4_llama(seed=4)
    model = cpu_paths.use_fast_cpu_paths(q4_llama(seed=4), keep_originals=True)
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert layers and not any(m.released for m in layers)
    ids = torch.tensor([[3, 41, 977, 12, 5]])
    with torch.no_grad():
        expected = model(ids).logits
    keys = model.state_dict()

    monkeypatch.setattr("structspec.spec.heap.file_backed", lambda at: [True] * len(at))
    assert release_originals(model) == 0
    monkeypatch.undo()

    released = release_originals(model)
    head = model.get_output_embeddings()
    assert released == len(layers) - 1 and not head.released  # tied: kept
    assert all(m.released for m in layers if m is not head)
    assert release_originals(model) == 0  # idempotent
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)
    after = model.state_dict()
    assert list(after) == list(keys)
    assert all(torch.equal(after[key], keys[key]) for key in keys)
    unpack_linears(model)
    plain = reference.state_dict()
    assert all(torch.equal(_bits(value), _bits(plain[key]))
               for key, value in model.state_dict().items())


@pytest.mark.skipif(not INT8, reason="the integer kernels do not run here")
def test_use_fast_cpu_paths_releases_unless_told_to_keep():
    kept = cpu_paths.use_fast_cpu_paths(q4_llama(seed=5), keep_originals=True)
    assert not any(m.released for m in kept.modules() if isinstance(m, PackedLinear))
    lean = cpu_paths.use_fast_cpu_paths(q4_llama(seed=5))
    assert any(m.released for m in lean.modules() if isinstance(m, PackedLinear))
    ids = torch.tensor([[7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(kept(ids).logits, lean(ids).logits)
