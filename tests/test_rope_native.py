"""Rotary embeddings by the native kernel (``structspec/_native/rope.c`` via
``structspec.spec.rope``): **bitwise** transformers' ``apply_rotary_pos_emb`` for every
shape and layout the decode loops pass, the original's results for everything else, and a
packed model's logits unchanged by it."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama import modeling_llama

from structspec import _native
from structspec.spec import rope

KERNEL = _native.runnable("rope")
pytestmark = pytest.mark.skipif(KERNEL is None,
                                reason="the rope kernel is not built here or the CPU lacks AVX2")
ORIGINAL = getattr(modeling_llama.apply_rotary_pos_emb, "_structspec_original",
                   modeling_llama.apply_rotary_pos_emb)
WRAPPED = rope.native_rotary(ORIGINAL)


def _states(hq: int, hkv: int, rows: int, d: int, seed: int, transposed: bool):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # as attention passes them: a projection's [1, rows, heads, d], transposed
        q = torch.randn(1, rows, hq, d, generator=g).transpose(1, 2)
        k = torch.randn(1, rows, hkv, d, generator=g).transpose(1, 2)
    else:
        q, k = torch.randn(1, hq, rows, d, generator=g), torch.randn(1, hkv, rows, d, generator=g)
    cos, sin = torch.randn(1, rows, d, generator=g), torch.randn(1, rows, d, generator=g)
    return q, k, cos, sin


@settings(max_examples=60, deadline=None)
@given(hq=st.integers(1, 12), group=st.sampled_from([1, 2, 3]), rows=st.integers(1, 40),
       d=st.sampled_from([2, 8, 10, 16, 32, 64, 80, 128]), seed=st.integers(0, 2**16),
       transposed=st.booleans())
def test_native_rotary_is_bitwise_the_original(hq, group, rows, d, seed, transposed):
    q, k, cos, sin = _states(hq * group, hq, rows, d, seed, transposed)
    with torch.inference_mode():
        want = ORIGINAL(q, k, cos, sin)
        got = WRAPPED(q, k, cos, sin)
    for a, b in zip(want, got, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


def test_a_row_is_the_same_alone_and_among_others():
    q, k, cos, sin = _states(9, 3, 12, 64, 0, True)
    with torch.inference_mode():
        many = WRAPPED(q, k, cos, sin)
        one = WRAPPED(q[:, :, 5:6], k[:, :, 5:6], cos[:, 5:6], sin[:, 5:6])
    assert torch.equal(many[0][:, :, 5:6], one[0]) and torch.equal(many[1][:, :, 5:6], one[1])


@pytest.mark.parametrize("case", ["grad", "float64", "batch2", "unsqueeze2", "odd"])
def test_other_calls_get_the_original(case):
    q, k, cos, sin = _states(4, 2, 3, 16, 1, False)
    args: tuple = ()
    if case == "float64":
        q, k, cos, sin = q.double(), k.double(), cos.double(), sin.double()
    elif case == "batch2":
        q, k, cos, sin = (torch.cat([t, t]) for t in (q, k, cos, sin))
    elif case == "unsqueeze2":  # [1, rows, heads, d] states with cos broadcast over heads
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        args = (2,)
    elif case == "odd":
        q, k, cos, sin = q[..., :15], k[..., :15], cos[..., :15], sin[..., :15]
    if case == "grad":
        q.requires_grad_(True)
        want, got = ORIGINAL(q, k, cos, sin), WRAPPED(q, k, cos, sin)
        assert got[0].requires_grad
    else:
        with torch.inference_mode():
            try:
                want = ORIGINAL(q, k, cos, sin, *args)
            except RuntimeError:  # the original refuses it: so must the wrapper
                with pytest.raises(RuntimeError):
                    WRAPPED(q, k, cos, sin, *args)
                return
            got = WRAPPED(q, k, cos, sin, *args)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a.detach(), b.detach())


def test_use_and_restore_on_a_model(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    ids = torch.tensor([[5, 17, 300, 41, 9, 2000]])
    rope.restore_rotary(model)
    with torch.inference_mode():
        before = model(ids).logits
        assert rope.use_native_rotary(model) and rope.native_rotary_active(model)
        assert rope.use_native_rotary(model)  # idempotent
        after = model(ids).logits
    rope.restore_rotary(model)
    assert not rope.native_rotary_active(model)
    assert modeling_llama.apply_rotary_pos_emb is ORIGINAL
    assert torch.equal(before, after)


def test_bad_shapes_are_refused_by_the_kernel():
    with pytest.raises(ValueError, match="even head size"):
        KERNEL.rotate(0, 1, 1, 7, 7, 7, 0, 0, 7, 0, 7, 7)
