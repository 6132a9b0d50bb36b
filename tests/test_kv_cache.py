"""The cache that grows in place (structspec/spec/kv_cache.py): the keys and values a
``DynamicLayer`` would hold after any sequence of appends, crops, tree pruning and foreign
writes, and bitwise the same logits when a model decodes over it."""

from __future__ import annotations

import copy
import os
import random
from unittest import mock

import pytest
import torch
from conftest import random_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from structspec import _native
from structspec.hf_compat import cache_kwargs
from structspec.spec.attention import use_grouped_sdpa
from structspec.spec.kv_cache import RoomyLayer, decoding_cache
from structspec.spec.verify import check_tree_cache, keep_path, rollback, verify_tree

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 6)),
    st.tuples(st.just("crop"), st.integers(1, 4)),
    st.tuples(st.just("prune"), st.integers(0, 2 ** 16)),
    st.tuples(st.just("foreign"), st.integers(0, 3)),
), min_size=1, max_size=25)


def _cache(layer) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [layer]
    cache.layer_class_to_replicate = None
    return cache


@settings(max_examples=60, deadline=None)
@given(ops=OPS, room=st.integers(1, 12), seed=st.integers(0, 1000))
def test_a_roomy_layer_holds_what_a_dynamic_layer_holds(ops, room, seed):
    """Appends past the room (it doubles), crops (rollback), a verified tree's pruning
    (keep_path: rows moved down in place) and a tensor set from outside (a batch reorder):
    after each, the same keys and values as transformers' own layer."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    ours, theirs = _cache(RoomyLayer(room)), _cache(DynamicLayer())
    for op, arg in ops:
        n = theirs.get_seq_length()
        if op == "append":
            k, v = torch.randn(1, 2, arg, 4, generator=gen), torch.randn(1, 2, arg, 4,
                                                                         generator=gen)
            a, b = ours.update(k, v, 0), theirs.update(k, v, 0)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        elif op == "crop" and n:
            for c in (ours, theirs):
                rollback(c, max(0, n - arg))
        elif op == "prune" and n > 1:
            past = rng.randrange(n)
            picked = sorted(rng.sample(range(n - past), rng.randrange(1, n - past + 1)))
            for c in (ours, theirs):
                keep_path(c, past, picked)
        elif op == "foreign" and n:
            for c in (ours, theirs):  # what a reorder or another library leaves behind
                layer = c.layers[0]
                layer.keys = layer.keys.clone() + arg
                layer.values = layer.values.clone() - arg
        assert ours.get_seq_length() == theirs.get_seq_length()
        if theirs.get_seq_length():
            assert torch.equal(ours.layers[0].keys, theirs.layers[0].keys)
            assert torch.equal(ours.layers[0].values, theirs.layers[0].values)


def test_decoding_caches_grow_in_place_on_cpu_and_keep_other_layers(tiny_model):
    model = tiny_model.model
    cache = decoding_cache(model, 40)
    assert [type(x) for x in cache.layers] == [RoomyLayer] * model.config.num_hidden_layers
    check_tree_cache(cache)
    lazy = decoding_cache(model, 40, DynamicCache())  # layers made as passes fill them
    lazy.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), 0)
    assert type(lazy.layers[0]) is RoomyLayer and lazy.layers[0]._k.shape[-2] == 40
    mixed = DynamicCache()
    mixed.layers = [DynamicSlidingWindowLayer(sliding_window=8), DynamicLayer()]
    mixed.layer_class_to_replicate = None
    decoding_cache(model, 40, mixed)
    assert [type(x) for x in mixed.layers] == [DynamicSlidingWindowLayer, RoomyLayer]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trees_over_a_roomy_cache_give_the_dynamic_caches_bits(tiny_model, seed):
    """Prefill, then trees verified and pruned, then a rollback, over both caches: the same
    logits bit for bit at every pass (the attention kernel reads the strided views in
    place)."""
    model = copy.deepcopy(tiny_model.model)
    if not use_grouped_sdpa(model):  # the row-exact kernel, which reads the views in place
        pytest.skip("the row-exact attention kernel does not run here")
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompt = [rng.randrange(100, vocab) for _ in range(rng.randrange(3, 20))]
    caches = [DynamicCache(config=model.config), decoding_cache(model, 8)]  # room: regrows
    with torch.inference_mode():
        outs = [model(torch.tensor([prompt]), **cache_kwargs(model, c), use_cache=True).logits
                for c in caches]
        assert torch.equal(*outs)
        past = len(prompt)
        for _ in range(4):
            tree = random_tree(rng, rng.randrange(2, 12), vocab)
            outs = [verify_tree(model, c, tree, past) for c in caches]
            assert torch.equal(*outs)
            node = rng.randrange(len(tree))
            for c in caches:
                keep_path(c, past, tree.path(node))
            past += len(tree.path(node))
        for c in caches:
            rollback(c, past - 2)
        outs = [model(torch.tensor([[321]]), **cache_kwargs(model, c), use_cache=True).logits
                for c in caches]
        assert torch.equal(*outs)


def test_room_grows_by_doubling_and_holds_little_for_a_long_bound():
    """A bound of 100,000 tokens for a request that stops after 20 allocates a few hundred;
    a request that outgrows its bound keeps doubling (a logarithmic number of copies)."""
    layer = RoomyLayer(100_000)
    for _ in range(20):
        layer.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    assert layer._k.shape[-2] <= 1 + 256
    small, rooms = RoomyLayer(3), set()
    for _ in range(2000):
        small.update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4))
        rooms.add(small._k.shape[-2])
    assert small.get_seq_length() == 2000 and len(rooms) <= 6


@settings(max_examples=80, deadline=None)
@given(heads=st.integers(1, 4), dim=st.sampled_from([1, 4, 8, 64]), layers=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       roomy=st.booleans(), past=st.integers(0, 6), tree=st.integers(1, 12),
       seed=st.integers(0, 1000))
def test_native_compaction_moves_the_rows_torch_moves(heads, dim, layers, dtype, roomy, past,
                                                      tree, seed):
    """keep_path's native row moves (structspec/_native/kvmove.c, every layer in one call)
    leave every layer's keys and values bitwise as its torch path does, for any ascending
    path, in roomy and plain layers alike."""
    if _native.load("kvmove") is None:
        pytest.skip("the kvmove kernel is not built here")
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    path = sorted(rng.sample(range(tree), rng.randrange(1, tree + 1)))
    keys = [torch.randn(1, heads, past + tree, dim, generator=gen).to(dtype)
            for _ in range(layers)]
    values = [torch.randn(1, heads, past + tree, dim, generator=gen).to(dtype)
              for _ in range(layers)]
    results = []
    for native in ("on", "off"):
        with mock.patch.dict(os.environ, {"STRUCTSPEC_NATIVE": native}):
            cache = DynamicCache()
            cache.layers = [RoomyLayer(4) if roomy else DynamicLayer() for _ in range(layers)]
            cache.layer_class_to_replicate = None
            for i, layer in enumerate(cache.layers):
                layer.update(keys[i].clone(), values[i].clone())
            keep_path(cache, past, path)
            results.append([(layer.keys.clone(), layer.values.clone()) for layer in cache.layers])
    keep = list(range(past)) + [past + p for p in path]
    for i, ((k1, v1), (k2, v2)) in enumerate(zip(*results, strict=True)):
        assert torch.equal(k1, keys[i][:, :, keep]) and torch.equal(v1, values[i][:, :, keep])
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_a_path_longer_than_the_kernels_buffer_takes_the_torch_route():
    """keep_path hands the native kernel no path longer than its index buffer (the module's
    ``MAX_PATH``): such a path is compacted by torch, with the same rows kept."""
    kernel = _native.load("kvmove")
    if kernel is None:
        pytest.skip("the kvmove kernel is not built here")
    tree = kernel.MAX_PATH + 3
    path = [0, *range(2, tree)]  # MAX_PATH + 1 nodes, all but the first moved
    keys = torch.arange(2 * (tree + 2), dtype=torch.float32).reshape(1, 1, tree + 2, 2)
    cache = DynamicCache()
    cache.layers = [RoomyLayer(4)]
    cache.layer_class_to_replicate = None
    cache.layers[0].update(keys.clone(), -keys.clone())
    with mock.patch.object(kernel, "keep_rows", side_effect=AssertionError("native")):
        keep_path(cache, 2, path)
    keep = [0, 1] + [2 + p for p in path]
    assert torch.equal(cache.layers[0].keys, keys[:, :, keep])
    assert torch.equal(cache.layers[0].values, -keys[:, :, keep])


def test_native_compaction_refuses_paths_it_cannot_move_safely():
    """The kernel checks its own contract: nodes ascend and never point below their slot."""
    kernel = _native.load("kvmove")
    if kernel is None:
        pytest.skip("the kvmove kernel is not built here")
    buf = torch.zeros(1, 1, 8, 4)
    for bad in ([1, 0], [0, 0], [2, 2]):
        with pytest.raises(ValueError, match="ascend"):
            kernel.keep_rows([buf.data_ptr()], 1, 0, 16, 0, bad)
    with pytest.raises(ValueError, match="bad sizes"):
        kernel.keep_rows([buf.data_ptr()], 0, 0, 16, 0, [0])
