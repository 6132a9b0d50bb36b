"""Row-exact attention (``structspec/_native/attend.c`` via
``structspec.spec.attention.row_exact_attention``): SDPA's results to float32 rounding for
every mask kind and shape, and a row's output **bitwise** the same whether its keys come in
a tree pass (between masked siblings), a causal prefill or a 1-row step — so the packed
model's tree logits are bitwise its sequential logits."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from conftest import random_tree, torch_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from structspec import _native
from structspec.hf_compat import cache_kwargs
from structspec.spec.attention import row_exact_attention, set_row_exact
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.tree import tree_attention
from structspec.spec.verify import keep_path, verify_tree

ATTEND = _native.load("attend")
pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(ATTEND is None or not ATTEND.available(),
                       reason="the attend kernel is not built here or the CPU lacks AVX2/FMA"),
]


class _Module:
    is_causal = True


def _qkv(hq: int, hkv: int, lq: int, lk: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hq, lq, d, generator=g), torch.randn(1, hkv, lk, d, generator=g),
            torch.randn(1, hkv, lk, d, generator=g))


def _sdpa(q, k, v, mask=None, causal=False):
    out = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=None if mask is None else mask.double()
        if mask.dtype != torch.bool else mask, is_causal=causal, enable_gqa=True)
    return out.transpose(1, 2).float()


@pytest.mark.parametrize(("hq", "hkv"), [(9, 3), (4, 2), (4, 4)])
@pytest.mark.parametrize("d", [8, 64, 128])
@pytest.mark.parametrize("lq", [1, 3, 17, 40])
def test_matches_sdpa_for_every_mask_kind(hq, hkv, d, lq):
    lk = lq + 70
    q, k, v = _qkv(hq, hkv, lq, lk, d, seed=hq * d + lq)
    with torch.inference_mode():
        # no mask: every key
        got = row_exact_attention(_Module(), q, k, v, None, None, is_causal=False)
        assert torch.allclose(got, _sdpa(q, k, v), atol=2e-6, rtol=1e-5)
        # causal (the prompt's prefill after a cache): key j visible to row i when j <= i + 70
        got = row_exact_attention(_Module(), q, k, v, None, None, is_causal=True)
        causal = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        want = _sdpa(q, k, v, causal[None, None])
        assert torch.allclose(got, want, atol=2e-6, rtol=1e-5) or lq == 1
        # a random additive mask (0 / finfo.min, every row seeing itself) and its bool twin
        rng = torch.Generator().manual_seed(lq)
        visible = torch.rand(lq, lk, generator=rng) < 0.6
        visible[torch.arange(lq), torch.arange(lq) + lk - lq] = True
        additive = torch.zeros(lq, lk).masked_fill(~visible, torch.finfo(torch.float32).min)
        want = _sdpa(q, k, v, visible[None, None])
        for mask in (additive[None, None], visible[None, None]):
            got = row_exact_attention(_Module(), q, k, v, mask, 0.3 if d == 8 else None)
            if d == 8:
                want8 = torch.nn.functional.scaled_dot_product_attention(
                    q.double(), k.double(), v.double(), attn_mask=visible[None, None],
                    scale=0.3, enable_gqa=True).transpose(1, 2).float()
                assert torch.allclose(got, want8, atol=2e-6, rtol=1e-5)
            else:
                assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(past=st.integers(1, 150), n=st.integers(1, 24), seed=st.integers(0, 2**16),
       threads=st.sampled_from([1, 2]))
def test_a_rows_output_does_not_depend_on_where_its_keys_sit(past, n, seed, threads):
    """A tree pass (each node's ancestors between masked siblings, additive mask) gives
    every node bitwise what a 1-row pass over the past and its path gives, on 1 or 2
    threads."""
    tree = random_tree(random.Random(seed), n, 200)  # (its tokens do not matter here)
    hq, hkv, d = 9, 3, 64
    q, k, v = _qkv(hq, hkv, n, past + n, d, seed)
    mask, _ = tree_attention(tree, past_len=past)
    with torch.inference_mode(), torch_threads(threads):
        whole = row_exact_attention(_Module(), q, k, v, mask, None)
        for i in range(n):
            keys = list(range(past)) + [past + j for j in tree.path(i)]
            alone = row_exact_attention(_Module(), q[:, :, i:i + 1], k[:, :, keys],
                                        v[:, :, keys], None, None)
            assert torch.equal(whole[:, i], alone[:, 0]), i


@settings(max_examples=30, deadline=None)
@given(past=st.integers(0, 40), prefix=st.integers(1, 120), n=st.integers(1, 12),
       seed=st.integers(0, 2**16), boolean=st.booleans(), threads=st.sampled_from([1, 2]))
def test_a_prompt_prefilled_under_the_first_trees_mask_gives_its_causal_rows(
        past, prefix, n, seed, boolean, threads):
    """The first pass prefills the prompt with the first tree under one mask (causal over
    the prompt, then the tree's): the kernel skips each row's keys past its last visible one,
    and every prompt row is bitwise the causal prefill's row, every node its 1-row pass's."""
    tree = random_tree(random.Random(seed), n, 200)  # (its tokens do not matter here)
    q, k, v = _qkv(9, 3, prefix + n, past + prefix + n, 64, seed)
    mask, _ = tree_attention(tree, past_len=past, prefix_len=prefix)
    if boolean:
        mask = mask > torch.finfo(torch.float32).min / 2
    with torch.inference_mode(), torch_threads(threads):
        whole = row_exact_attention(_Module(), q, k, v, mask, None)
        causal = row_exact_attention(_Module(), q[:, :, :prefix], k[:, :, :past + prefix],
                                     v[:, :, :past + prefix], None, None, is_causal=True)
        assert torch.equal(whole[:, :prefix], causal)
        for i in range(n):
            keys = list(range(past + prefix)) + [past + prefix + j for j in tree.path(i)]
            alone = row_exact_attention(_Module(), q[:, :, prefix + i:prefix + i + 1],
                                        k[:, :, keys], v[:, :, keys], None, None)
            assert torch.equal(whole[:, prefix + i], alone[:, 0]), i


@pytest.mark.parametrize("lq", [2, 9, 40])
def test_causal_rows_equal_their_one_row_passes(lq):
    q, k, v = _qkv(9, 3, lq, lq + 5, 64, seed=lq)
    with torch.inference_mode():
        whole = row_exact_attention(_Module(), q, k, v, None, None, is_causal=None)
        for i in range(lq):
            visible = i + 5 + 1
            alone = row_exact_attention(_Module(), q[:, :, i:i + 1], k[:, :, :visible],
                                        v[:, :, :visible], None, None)
            assert torch.equal(whole[:, i], alone[:, 0])


def test_calls_it_does_not_take_go_back_to_sdpa():
    q, k, v = _qkv(4, 2, 3, 8, 64, 0)
    mod = _Module()
    with torch.inference_mode():
        assert row_exact_attention(mod, q, k, v, None, None) is not None
        assert row_exact_attention(mod, q.repeat(2, 1, 1, 1), k.repeat(2, 1, 1, 1),
                                   v.repeat(2, 1, 1, 1), None, None) is None  # a batch
        assert row_exact_attention(mod, q.double(), k.double(), v.double(), None) is None
        q12, k12, v12 = _qkv(4, 2, 3, 8, 12, 0)
        assert row_exact_attention(mod, q12, k12, v12, None, None) is None  # d % 8
        assert row_exact_attention(mod, q, k, v, torch.zeros(1, 4, 3, 8), None) is None
        assert row_exact_attention(mod, q, k, v, torch.zeros(1, 1, 3, 8, dtype=torch.float16),
                                   None) is None
        before = set_row_exact(False)
        try:
            assert row_exact_attention(mod, q, k, v, None, None) is None
        finally:
            set_row_exact(before)
    assert row_exact_attention(mod, q, k, v, None, None) is None  # autograd on


def test_kernel_refuses_bad_shapes():
    with pytest.raises(ValueError, match="bad shape"):
        ATTEND.attend(0, 0, 0, 9, 2, 1, 4, 64, 0, 0, 1.0, 0, 1)  # 9 heads over 2
    with pytest.raises(ValueError, match="bad shape"):
        ATTEND.attend(0, 0, 0, 9, 3, 1, 4, 60, 0, 0, 1.0, 0, 1)  # d % 8
    with pytest.raises(ValueError, match="bad shape"):
        ATTEND.attend(0, 0, 0, 9, 3, 1, 4, 64, 0, 2, 1.0, 0, 1)  # a float mask, no pointer


@settings(max_examples=25, deadline=None)
@given(lq=st.integers(1, 12), extra=st.integers(1, 40), wider=st.integers(0, 9),
       kind=st.sampled_from([2, 3]), seed=st.integers(0, 2**16))
def test_strided_queries_and_wider_masks_are_read_in_place(lq, extra, wider, kind, seed):
    """A query laid out [lq, hq, d] (transformers' projections before their transpose) and a
    mask with more columns than keys give the bits of their contiguous copies."""
    hq, hkv, d = 6, 2, 32
    lk = lq + extra
    g = torch.Generator().manual_seed(seed)
    q_rows = torch.randn(lq, hq, d, generator=g)  # [lq, hq, d]
    k, v = torch.randn(hkv, lk, d, generator=g), torch.randn(hkv, lk, d, generator=g)
    visible = torch.rand(lq, lk + wider, generator=g) < 0.7
    visible[torch.arange(lq), torch.arange(lq) + extra] = True
    wide = (torch.zeros(lq, lk + wider).masked_fill(~visible, float("-inf")) if kind == 2
            else visible.contiguous().view(torch.uint8))
    narrow = wide[:, :lk].contiguous()
    q = q_rows.transpose(0, 1)  # [hq, lq, d] view
    dense = q.contiguous()
    got, want = torch.empty(1, lq, hq, d), torch.empty(1, lq, hq, d)
    ATTEND.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), hq, hkv, lq, lk, d,
                  wide.data_ptr(), kind, 0.3, got.data_ptr(), 1, wide.stride(0), q.stride(0),
                  q.stride(1))
    ATTEND.attend(dense.data_ptr(), k.data_ptr(), v.data_ptr(), hq, hkv, lq, lk, d,
                  narrow.data_ptr(), kind, 0.3, want.data_ptr(), 1)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="bad shape"):  # a mask row shorter than the keys
        ATTEND.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), hq, hkv, lq, lk, d,
                      wide.data_ptr(), kind, 0.3, got.data_ptr(), 1, lk - 1)


@pytest.mark.parametrize(("hq", "hkv", "lq"), [(1, 1, 1), (1, 1, 3), (4, 2, 1), (4, 2, 5)])
def test_queries_and_masks_of_any_layout_give_the_contiguous_bits(hq, hkv, lq):
    """``row_exact_attention`` reads a query and a mask in place where their rows allow
    (transposed projections, a mask wider than the keys) and copies them where not (size-1
    dimensions with odd strides, expanded tensors): the same bits as contiguous inputs."""
    d, lk = 16, lq + 6
    g = torch.Generator().manual_seed(hq * 10 + lq)
    k, v = torch.randn(1, hkv, lk, d, generator=g), torch.randn(1, hkv, lk, d, generator=g)
    base = torch.randn(1, lq, hq, d, generator=g)
    mask = torch.zeros(1, 1, lq, lk + 3)
    mask[..., lq + 2:lq + 4] = float("-inf")
    dense_q, dense_mask = base.transpose(1, 2).contiguous(), mask[..., :lk].contiguous()
    with torch.inference_mode():
        want = row_exact_attention(_Module(), dense_q, k, v, dense_mask, None)
        # size-1 dimensions may carry any stride: give them odd ones
        odd_strides = (hq * lq * d, 3 if hq == 1 else lq * d, 7 if lq == 1 else d, 1)
        queries = [base.transpose(1, 2),  # the projections' layout
                   dense_q.as_strided(dense_q.shape, odd_strides),
                   dense_q,
                   dense_q[..., :1].expand(1, hq, lq, d)]  # stride 0 along d: copied
        masks = [mask, mask.expand(1, 1, lq, lk + 3), dense_mask,
                 mask[..., :1].expand(1, 1, lq, lk)]  # stride 0 along the keys: copied
        for q in queries[:3]:
            for m in masks[:3]:
                assert torch.equal(row_exact_attention(_Module(), q, k, v, m, None), want)
        odd = row_exact_attention(_Module(), queries[3], k, v, masks[3], None)
        ref = row_exact_attention(_Module(), queries[3].contiguous(), k, v,
                                  masks[3].contiguous(), None)
        assert torch.equal(odd, ref)


def _modes() -> list[int]:
    """The kernel's loop variants this CPU runs (2 needs AVX-512F/VL/DQ)."""
    return list(range(ATTEND.max_tiles() + 1))


def _assert_modes_agree(q, k, v, mask, kind, scale, threads):
    """Run ``attend`` in every loop variant this CPU has (``q`` ``[Hq, lq, d]``, ``k``/``v``
    ``[Hkv, lk, d]``) and assert finite, bitwise equal outputs."""
    (hq, lq, d), (hkv, lk) = q.shape, k.shape[:2]
    outs = []
    before = ATTEND.set_tiles(0)
    try:
        for mode in _modes():
            ATTEND.set_tiles(mode)
            out = torch.empty(1, lq, hq, d)
            ATTEND.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), hq, hkv, lq, lk, d,
                          0 if mask is None else mask.data_ptr(), kind, scale, out.data_ptr(),
                          threads)
            outs.append(out)
    finally:
        ATTEND.set_tiles(before)
    assert torch.isfinite(outs[0]).all()
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@settings(max_examples=60, deadline=None)
@given(hkv=st.integers(1, 4), group=st.integers(1, 4), d=st.sampled_from([8, 24, 32, 64, 96]),
       lq=st.integers(1, 30), extra=st.integers(0, 80), kind=st.sampled_from([0, 1, 2, 3]),
       seed=st.integers(0, 2**16), threads=st.sampled_from([1, 2]))
def test_register_tiles_give_bitwise_the_one_pair_loops_results(hkv, group, d, lq, extra, kind,
                                                                seed, threads):
    """The register-tiled loops (several (head, row) pairs per key load, masked keys added
    as zeros) against the one-pair loops that skip them: bitwise equal for every mask kind,
    head grouping, head size (the weighted sums' tiles need d % 32 == 0, the rest falls back)
    and thread count — including additive masks with finite non-zero values."""
    hq, lk = hkv * group, lq + extra
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(hq, lq, d, generator=g), torch.randn(hkv, lk, d, generator=g),
               torch.randn(hkv, lk, d, generator=g))
    visible = torch.rand(lq, lk, generator=g) < 0.6
    visible[torch.arange(lq), torch.arange(lq) + extra] = True
    mask = None
    if kind == 2:
        mask = torch.zeros(lq, lk).masked_fill(~visible, torch.finfo(torch.float32).min)
        mask += torch.randn(lq, lk, generator=g) * visible
    elif kind == 3:
        mask = visible.contiguous().view(torch.uint8)
    _assert_modes_agree(q, k, v, mask, kind, 0.3, threads)


@settings(max_examples=40, deadline=None)
@given(hkv=st.integers(1, 3), group=st.integers(1, 3), lq=st.integers(1, 24),
       cached=st.integers(0, 300), kind=st.sampled_from([1, 2, 3]), spread=st.sampled_from(
           [0.1, 1.0, 30.0]), seed=st.integers(0, 2**16))
def test_the_loops_agree_where_every_row_sees_the_cache(hkv, group, lq, cached, kind, spread,
                                                        seed):
    """Tree passes: every row sees the ``cached`` keys, then a tree-like pattern among the
    last ``lq`` (each row itself and some of the rows before it). The tiles skip the per-key
    visibility test over the keys every pair of a tile sees, and the 512-bit loops (head size
    64) run 16 keys a vector: bitwise the one-pair loops' results, from flat to peaked
    scores (``spread``), for long caches (several key chunks) and odd key counts."""
    hq, lk, d = hkv * group, cached + lq, 64
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, lq, d, generator=g) * spread
    k, v = torch.randn(hkv, lk, d, generator=g), torch.randn(hkv, lk, d, generator=g)
    tree = torch.rand(lq, lq, generator=g) < 0.5
    tree = (tree.tril() | torch.eye(lq, dtype=torch.bool))
    visible = torch.cat([torch.ones(lq, cached, dtype=torch.bool), tree], dim=1)
    mask = None
    if kind == 2:
        mask = torch.zeros(lq, lk).masked_fill(~visible, torch.finfo(torch.float32).min)
    elif kind == 3:
        mask = visible.contiguous().view(torch.uint8)
    _assert_modes_agree(q, k, v, mask, kind, 0.125, 1)


def test_a_key_masked_for_one_row_of_a_tile_is_skipped_not_added_as_zero():
    """Row 0 does not see key 2, row 1 does (one tile). Row 0's weighted sum in dimension 0
    underflows to -0 (key 0: p = 0.3 times the smallest negative denormal; key 1: p = 1
    times -0); adding key 2 as fma(0, 1.0, -0) would make it +0. Every loop variant skips
    the key for row 0: its output keeps the -0 of the row's 1-row call."""
    d, scale = 32, 1.0
    q = torch.zeros(1, 2, d)
    q[0, :, 0] = 1.0
    k = torch.zeros(1, 3, d)
    k[0, 0, 0] = float(torch.log(torch.tensor(0.3)))  # score ln 0.3 against key 1's 0
    k[0, 2, 0] = -50.0  # row 1 sees key 2 with a tiny weight
    v = torch.ones(1, 3, d)
    v[0, 0, 0] = -torch.finfo(torch.float32).smallest_normal * 2.0**-23  # -1.4e-45
    v[0, 1, 0] = -0.0
    v[0, 2, 0] = 1.0
    mask = torch.tensor([[0.0, 0.0, torch.finfo(torch.float32).min], [0.0, 0.0, 0.0]])
    alone_mask = torch.zeros(1, 2)
    before = ATTEND.set_tiles(0)
    try:
        for mode in _modes():
            ATTEND.set_tiles(mode)
            out = torch.empty(1, 2, 1, d)
            ATTEND.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), 1, 1, 2, 3, d,
                          mask.data_ptr(), 2, scale, out.data_ptr(), 1)
            alone = torch.empty(1, 1, 1, d)
            q0 = q[:, :1].contiguous()
            ATTEND.attend(q0.data_ptr(), k.data_ptr(), v.data_ptr(), 1, 1, 1, 2, d,
                          alone_mask.data_ptr(), 2, scale, alone.data_ptr(), 1)
            assert out[0, 0, 0, 0] == 0 and torch.signbit(out[0, 0, 0, 0]), mode
            assert torch.equal(out[0, 0], alone[0, 0]), mode
    finally:
        ATTEND.set_tiles(before)


def test_set_tiles_refuses_unknown_modes():
    with pytest.raises(ValueError, match="set_tiles"):
        ATTEND.set_tiles(3)
    assert ATTEND.tiles() == ATTEND.max_tiles()  # the default: the widest tiles


@pytest.fixture(scope="module")
def packed(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    use_fast_cpu_paths(model)
    return model


@pytest.mark.parametrize("seed", range(4))
def test_packed_models_tree_logits_are_bitwise_their_sequential_logits(packed, seed):
    rng = random.Random(seed)
    vocab = packed.config.vocab_size
    cached = [rng.randrange(100, vocab) for _ in range(rng.randrange(2, 30))]
    prefix = [rng.randrange(100, vocab) for _ in range(rng.randrange(0, 6))]
    tree = random_tree(rng, rng.randrange(2, 18), vocab)
    with torch.inference_mode():
        cache = DynamicCache(config=packed.config)
        packed(input_ids=torch.tensor([cached]), **cache_kwargs(packed, cache), use_cache=True)
        logits = verify_tree(packed, cache, tree, len(cached), prefix)  # prefill + tree
        for i in range(len(tree)):
            steps = DynamicCache(config=packed.config)
            packed(input_ids=torch.tensor([cached]), **cache_kwargs(packed, steps), use_cache=True)
            row = None
            for tok in prefix + [tree.tokens[j] for j in tree.path(i)]:
                row = packed(input_ids=torch.tensor([[tok]]), **cache_kwargs(packed, steps),
                             use_cache=True).logits[0, -1]
            assert torch.equal(logits[i], row), i
        # and after keeping a path, the next pass continues as the sequential cache would
        node = max(range(len(tree)), key=lambda j: tree.depths[j])
        keep_path(cache, len(cached) + len(prefix), tree.path(node))
        nxt = packed(input_ids=torch.tensor([[321]]), **cache_kwargs(packed, cache),
                     use_cache=True).logits[0, -1]
        seq = cached + prefix + [tree.tokens[j] for j in tree.path(node)] + [321]
        fresh = packed(input_ids=torch.tensor([seq]), logits_to_keep=1).logits[0, -1]
        assert torch.equal(nxt, fresh)
