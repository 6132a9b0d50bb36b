"""Packed weights in a huge-page arena (:mod:`structspec.spec.hugepages`): the same bytes in
one 2 MB-aligned mapping, the same outputs, nothing moved where huge pages are unavailable
or asked for twice."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structspec.spec import hugepages as hp
from structspec.spec.block_quant import dequantize, quantize_q4_1
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.fastlinear import PackedLinear, available_kernels

INT8 = "panel_int8" in available_kernels(approx=True)
needs_int8 = pytest.mark.skipif(not INT8, reason="the qdot kernel does not run here")
needs_thp = pytest.mark.skipif(not hp.huge_pages_available(),
                               reason="no transparent huge pages on this OS")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the arena maps anonymous memory and calls madvise (Linux)")
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.uint8, torch.int8, torch.float32]),
                          st.integers(1, 3000)), min_size=1, max_size=6))
def test_arena_holds_equal_aligned_copies(specs):
    """Every copy equals its tensor, starts on a cache line inside the mapping, and the
    mapping starts on a 2 MB boundary."""
    gen = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(n, generator=gen) * 50).to(dtype) for dtype, n in specs]
    arena = hp.HugePageArena(tensors)
    assert arena.base % hp.HUGE == 0 and arena.nbytes % hp.HUGE == 0
    for t, copy in zip(tensors, arena.tensors):
        assert copy.dtype == t.dtype and copy.shape == t.shape and torch.equal(copy, t)
        assert copy.data_ptr() % 64 == 0
        assert arena.base <= copy.data_ptr() < arena.base + arena.nbytes
        assert copy.data_ptr() != t.data_ptr()


def _packed_stack(layers: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    mods = []
    for k, n in [(64, 96), (96, 64)] * layers:
        lin = nn.Linear(k, n).eval()
        with torch.no_grad():  # exactly Q4_1, as the default model's weights
            lin.weight.copy_(torch.from_numpy(dequantize(quantize_q4_1(lin.weight.numpy()))))
        mods.append(PackedLinear(lin, "panel_int8"))
    return nn.Sequential(*mods)


@needs_int8
@needs_thp
def test_use_huge_pages_keeps_outputs_and_runs_once():
    net = _packed_stack()
    x = torch.randn(5, 64)
    with torch.inference_mode():
        before = net(x)
    arena = hp.use_huge_pages(net)
    assert arena is not None
    for layer in net:
        assert arena.base <= layer._ipacked.data_ptr() < arena.base + arena.nbytes
    with torch.inference_mode():
        assert torch.equal(net(x), before)
    panels = [layer._ipacked for layer in net]
    assert hp.use_huge_pages(net) is None  # already moved: nothing again
    assert all(a is b for a, b in zip(panels, (layer._ipacked for layer in net)))
    assert hp.huge_page_mb(net) >= 0.0


@needs_int8
def test_nothing_moves_without_huge_pages(monkeypatch, tmp_path):
    monkeypatch.setattr(hp, "_THP", tmp_path / "missing")
    assert not hp.huge_pages_available()
    net = _packed_stack(1)
    panels = [layer._ipacked for layer in net]
    assert hp.use_huge_pages(net) is None
    assert all(a is layer._ipacked for a, layer in zip(panels, net))
    assert hp.huge_page_mb(net) == 0.0


def test_thp_off_reads_as_unavailable(monkeypatch, tmp_path):
    mode = tmp_path / "enabled"
    mode.write_text("always madvise [never]\n")
    monkeypatch.setattr(hp, "_THP", mode)
    assert not hp.huge_pages_available()
    mode.write_text("always [madvise] never\n")
    assert hp.huge_pages_available() == hp.sys.platform.startswith("linux")


def test_a_module_without_panels_is_left_alone():
    net = nn.Sequential(nn.Linear(4, 4))
    assert hp.use_huge_pages(net) is None
    assert hp.huge_page_mb(net) == 0.0


@needs_int8
@needs_thp
def test_fast_cpu_paths_take_huge_pages_unless_told_not_to():
    class Tiny(nn.Module):  # what use_fast_cpu_paths packs: a float32 CPU module
        def __init__(self) -> None:
            super().__init__()
            self.body = _packed_stack(1)[0].original

    on, off = Tiny(), Tiny()
    use_fast_cpu_paths(on)
    use_fast_cpu_paths(off, huge_pages=False)
    assert getattr(on, hp.ARENA_ATTR, None) is not None
    assert getattr(off, hp.ARENA_ATTR, None) is None


@needs_int8
@needs_thp
def test_copies_and_pickles_of_a_moved_module_hold_no_arena():
    import copy
    import io

    net = _packed_stack(1)
    hp.use_huge_pages(net)
    x = torch.randn(3, 64)
    copied = copy.deepcopy(net)
    assert getattr(copied, hp.ARENA_ATTR, "missing") is None
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert getattr(loaded, hp.ARENA_ATTR, "missing") is None
    with torch.inference_mode():
        assert torch.equal(copied(x), net(x)) and torch.equal(loaded(x), net(x))
    assert hp.use_huge_pages(copied) is not None  # a copy may take its own


@needs_int8
@needs_thp
def test_unpacking_lets_go_of_the_arena_and_packing_again_takes_a_new_one():
    from structspec.spec.fastlinear import pack_linears, unpack_linears

    net = _packed_stack(1)
    hp.use_huge_pages(net)
    unpack_linears(net)
    assert getattr(net, hp.ARENA_ATTR, None) is None
    assert all(type(layer) is nn.Linear for layer in net)
    pack_linears(net, "panel_int8")
    assert hp.use_huge_pages(net) is not None
