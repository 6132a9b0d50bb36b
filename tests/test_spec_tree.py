"""Draft trees and verification on a tiny random model: tree logits equal sequential logits,
KV compaction equals a fresh recompute, a failing forward leaves the cache intact."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_tree

from structspec.automata.regex import compile_regex
from structspec.engine import free_text
from structspec.hf_compat import cache_kwargs
from structspec.spec.attention import use_grouped_sdpa
from structspec.spec.fastlinear import pack_linears, packing_available, unpack_linears
from structspec.spec.tree import DraftTree, TreeBuilder, chain, tree_attention
from structspec.spec.verify import (
    UnsupportedModelError,
    check_tree_support,
    keep_path,
    rollback,
    verify_tree,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tiny_model):
    """The tiny model (sdpa), an eager-attention copy with the same weights, and a copy
    switched to grouped tree attention (:func:`use_grouped_sdpa`)."""
    from transformers import LlamaForCausalLM

    sdpa = tiny_model.model
    copies = {}
    for attn in ("eager", "grouped"):
        config = sdpa.config.__class__.from_dict(sdpa.config.to_dict())
        config._attn_implementation = "eager" if attn == "eager" else "sdpa"
        copies[attn] = LlamaForCausalLM(config).eval()
        copies[attn].load_state_dict(sdpa.state_dict())
    assert use_grouped_sdpa(copies["grouped"])
    return {"sdpa": sdpa, **copies}


def _prefill(model, ids):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), **cache_kwargs(model, cache),
              use_cache=True, logits_to_keep=1)
    return cache


def _fresh_logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_draft_tree_validates_structure():
    t = DraftTree((5, 6, 7, 8), (-1, 0, 0, 1), (0, 1, 1, 2), (0, 1, 2, 3), ("root",) + ("x",) * 3)
    assert t.children == ((1, 2), (3,), (), ())
    assert t.path(3) == [0, 1, 3] and t.path_tokens(3) == [6, 8] and t.max_depth == 2
    with pytest.raises(ValueError, match="precede"):
        DraftTree((1, 2), (-1, 1), (0, 1), (0, 0), ("a", "b"))
    with pytest.raises(ValueError, match="depth"):
        DraftTree((1, 2), (-1, 0), (0, 2), (0, 0), ("a", "b"))


def test_tree_attention_is_additive_float_with_depth_positions():
    t = DraftTree((5, 6, 7, 8), (-1, 0, 0, 1), (0, 1, 1, 2), (0,) * 4, ("x",) * 4)
    mask, pos = tree_attention(t, past_len=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 4, 7) and mask.dtype == torch.float32
    assert pos.tolist() == [[3, 4, 4, 5]]
    visible = mask[0, 0] == 0
    assert visible[:, :3].all()  # the past is visible to every node
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=bool)
    assert torch.equal(visible[:, 3:], expected)
    assert (mask[0, 0][~visible] == torch.finfo(torch.float32).min).all()


def test_tree_builder_keeps_every_node_legal(byte_vocab):
    c = compile_regex(r'\{"a":(true|false)\}', byte_vocab)
    b = TreeBuilder(c, 0, c.initial, max_depth=4, max_nodes=3, max_branches=1, eos_ids=[0])
    assert b.add(0, byte_vocab.ids_for(b"[")[0], "x") is None  # illegal
    assert b.add(0, 0, "x") is None  # EOS is never drafted
    n1 = b.add(0, byte_vocab.ids_for(b"{")[0], "x")
    assert n1 == 1 and b.add(0, byte_vocab.ids_for(b"{")[0], "x") == 1  # dedup
    end = b.add_chain(n1, [byte_vocab.ids_for(bytes([ch]))[0] for ch in b'"a":t'], "x")
    assert b.depths[end] == 3 and b.counted == 3  # node budget of 3 stopped the chain
    tree = b.freeze()
    for i in range(1, len(tree)):
        assert c.advance(tree.states[tree.parents[i]], tree.tokens[i]) == tree.states[i]


def test_drafter_scores_travel_with_their_nodes(byte_vocab):
    c = free_text(byte_vocab)
    ids = [byte_vocab.ids_for(bytes([ch]))[0] for ch in b"abcd"]
    b = TreeBuilder(c, ids[0], c.initial, max_depth=4, max_nodes=8, max_branches=4)
    assert b.freeze().scores == ()  # no scored node: no scores at all
    n1 = b.add(0, ids[1], "x")
    assert b.freeze().score(n1) is None
    assert b.add(0, ids[1], "head", score=0.7) == n1  # an unscored node takes the score
    assert b.add(0, ids[1], "head", score=0.2) == n1 and b.scores[n1] == 0.7  # not twice
    n2 = b.add_branch(0, [ids[2], ids[3]], "head", score=0.4)  # the first node's score
    tree = b.freeze()
    assert tree.score(n1) == 0.7 and tree.score(tree.parents[n2]) == 0.4
    assert tree.score(n2) is None and tree.score(0) is None
    sub = tree.subtree([tree.parents[n2]])
    assert sub.score(1) == 0.4 and len(sub.scores) == len(sub)
    with pytest.raises(ValueError, match="scores"):
        DraftTree((1, 2), (-1, 0), (0, 1), (0, 0), ("a", "b"), (0.5,))


@pytest.mark.parametrize("attn", ["sdpa", "eager", "grouped"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logits_equal_sequential_logits(models, attn, seed):
    model = models[attn]
    rng = random.Random(seed)
    vocab_size = model.config.vocab_size
    prompt = [rng.randrange(100, vocab_size) for _ in range(rng.randrange(2, 12))]
    tree = random_tree(rng, rng.randrange(2, 18), vocab_size)
    cache = _prefill(model, prompt)
    with torch.inference_mode():
        logits = verify_tree(model, cache, tree, len(prompt))  # [q, V]
    assert cache.get_seq_length() == len(prompt) + len(tree)
    for i in range(len(tree)):
        ref = _fresh_logits(model, prompt + [tree.tokens[j] for j in tree.path(i)])
        assert torch.allclose(logits[i], ref, atol=1e-4), (i, (logits[i] - ref).abs().max())


@pytest.mark.parametrize("attn", ["sdpa", "eager", "grouped"])
def test_prefill_and_first_tree_in_one_pass(models, attn):
    model = models[attn]
    rng = random.Random(7)
    vocab_size = model.config.vocab_size
    cached = [rng.randrange(100, vocab_size) for _ in range(3)]
    prefix = [rng.randrange(100, vocab_size) for _ in range(9)]
    tree = random_tree(rng, 8, vocab_size)
    cache = _prefill(model, cached)
    with torch.inference_mode():
        logits = verify_tree(model, cache, tree, len(cached), prefix)  # [q, V]
        assert logits.shape[0] == len(tree)
        node = max(range(len(tree)), key=lambda i: tree.depths[i])
        keep_path(cache, len(cached) + len(prefix), tree.path(node))
        seq = cached + prefix + [tree.tokens[j] for j in tree.path(node)]
        after = verify_tree(model, cache, chain([321], [None]), len(seq))
    for i in range(len(tree)):
        ref = _fresh_logits(model, cached + prefix + [tree.tokens[j] for j in tree.path(i)])
        assert torch.allclose(logits[i], ref, atol=1e-4)
    assert torch.allclose(after[0], _fresh_logits(model, [*seq, 321]), atol=1e-4)


def test_tree_attention_with_a_prefix_is_causal_over_the_prefix():
    t = DraftTree((5, 6, 7), (-1, 0, 0), (0, 1, 1), (0,) * 3, ("x",) * 3)
    mask, pos = tree_attention(t, past_len=2, prefix_len=2)
    assert mask.shape == (1, 1, 5, 7) and pos.tolist() == [[2, 3, 4, 5, 5]]
    visible = (mask[0, 0] == 0).int().tolist()
    assert visible == [[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0],
                       [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 1]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_keep_path_then_continue_equals_fresh_recompute(models, seed):
    model = models["sdpa"]
    rng = random.Random(seed)
    vocab_size = model.config.vocab_size
    prompt = [rng.randrange(100, vocab_size) for _ in range(rng.randrange(2, 10))]
    tree = random_tree(rng, rng.randrange(3, 16), vocab_size)
    cache = _prefill(model, prompt)
    with torch.inference_mode():
        verify_tree(model, cache, tree, len(prompt))
        node = rng.randrange(len(tree))
        path = tree.path(node)
        keep_path(cache, len(prompt), path)
        assert cache.get_seq_length() == len(prompt) + len(path)
        # Continue with a second tree on the compacted cache.
        seq = prompt + [tree.tokens[j] for j in path]
        nxt = random_tree(rng, 5, vocab_size)
        logits = verify_tree(model, cache, nxt, len(seq))
    for i in range(len(nxt)):
        ref = _fresh_logits(model, seq + [nxt.tokens[j] for j in nxt.path(i)])
        assert torch.allclose(logits[i], ref, atol=1e-4)


def test_keep_path_of_a_chain_prefix_just_crops(models):
    model = models["sdpa"]
    prompt = [300, 301, 302]
    tree = chain([400, 401, 402, 403], [None] * 4)
    cache = _prefill(model, prompt)
    with torch.inference_mode():
        verify_tree(model, cache, tree, len(prompt))
        keep_path(cache, len(prompt), [0, 1])
        logits = verify_tree(model, cache, chain([402], [None]), len(prompt) + 2)
    ref = _fresh_logits(model, [*prompt, 400, 401, 402])
    assert torch.allclose(logits[0], ref, atol=1e-4)
    with pytest.raises(ValueError, match="ascending"):
        keep_path(cache, 0, [2, 1])


def test_a_forward_that_raises_midway_leaves_the_cache_as_it_was(models, monkeypatch):
    model = models["sdpa"]
    prompt = [300, 301, 302, 303]
    cache = _prefill(model, prompt)
    layer = model.model.layers[1]

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(layer, "forward", boom)
    tree = chain([400, 401, 402], [None] * 3)
    with pytest.raises(RuntimeError, match="boom"), torch.inference_mode():
        verify_tree(model, cache, tree, len(prompt))
    monkeypatch.undo()
    assert [lay.keys.shape[-2] for lay in cache.layers] == [len(prompt)] * len(cache.layers)
    with torch.inference_mode():
        logits = verify_tree(model, cache, tree, len(prompt))
    ref = _fresh_logits(model, [*prompt, 400, 401, 402])
    assert torch.allclose(logits[2], ref, atol=1e-4)
    rollback(cache, 2)
    assert cache.get_seq_length() == 2


def test_models_without_4d_masks_are_refused(models):
    class Fake:
        class config:  # mimics a transformers config
            _attn_implementation = "flash_attention_2"

    with pytest.raises(UnsupportedModelError, match="4D mask"):
        check_tree_support(Fake())
    check_tree_support(models["sdpa"])
    check_tree_support(models["eager"])
    check_tree_support(models["grouped"])


@pytest.mark.skipif(not packing_available(), reason="oneDNN linear ops unavailable")
def test_packed_linears_give_the_same_logits(tiny_model):
    from transformers import LlamaForCausalLM

    src = tiny_model.model
    model = LlamaForCausalLM(src.config.__class__.from_dict(src.config.to_dict())).eval()
    model.load_state_dict(src.state_dict())
    ids = torch.tensor([[300, 301, 302, 303, 304, 305]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
        pack_linears(model)
        assert type(model.lm_head).__name__ == "PackedLinear"
        pack_linears(model)  # idempotent
        packed = model(input_ids=ids).logits
        cache = _prefill(model, [300, 301, 302])
        tree_logits = verify_tree(model, cache, random_tree(random.Random(0), 6, 5000), 3)
    assert (packed - ref).abs().max().item() < 1e-3
    assert tree_logits.shape[0] == 6
    unpack_linears(model)
    assert type(model.lm_head).__name__ == "Linear"
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, ref)


def test_tree_passes_on_cuda_keep_attention_off_cudnn():
    """cuDNN attention builds a graph per new shape (every tree pass): a tree pass on CUDA
    leaves it out and keeps the other backends as the process set them; off CUDA nothing
    changes."""
    from structspec.spec.verify import tree_pass_attention

    cuda = torch.backends.cuda
    before = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(),
              cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
    with tree_pass_attention("cpu"):
        assert cuda.cudnn_sdp_enabled() == before[0]
    with tree_pass_attention("cuda:0"):
        assert not cuda.cudnn_sdp_enabled()
        assert (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                cuda.math_sdp_enabled()) == before[1:]
    assert (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(),
            cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()) == before
    cuda.enable_math_sdp(False)
    try:
        with tree_pass_attention(torch.device("cuda")):
            assert not cuda.math_sdp_enabled() and not cuda.cudnn_sdp_enabled()
    finally:
        cuda.enable_math_sdp(before[3])


def test_the_tree_pass_benchmark_runs(tmp_path, capsys):
    """benchmarks/tree_pass_profile.py (the GPU check's pass timings): one row per dtype and
    context with a time per node count, written as JSON too."""
    import json

    from conftest import load_benchmark

    out = tmp_path / "passes.json"
    assert load_benchmark("tree_pass_profile.py").main(
        ["--contexts", "8", "--nodes", "1,3", "--repeats", "1", "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["dtype"], r["context"], sorted(r["ms"])) for r in rows] == [
        ("float32", 8, ["1", "3"])]
    assert all(t > 0 for t in rows[0]["ms"].values())
