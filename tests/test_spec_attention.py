"""Grouped tree attention (``structspec.spec.attention``): the same logits as transformers'
sdpa for every pass shape, switched on only where it applies, and lossless speculation."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_tree, run_decode, tiny_llama

from structspec import _native
from structspec.engine import decode, free_text
from structspec.hf_compat import cache_kwargs
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.attention import IMPLEMENTATION, restore_sdpa, use_grouped_sdpa
from structspec.spec.verify import check_tree_support, rollback, verify_tree
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")


def _copy(model, attn: str = "sdpa", kv_heads: int | None = None):
    from transformers import LlamaForCausalLM

    config = model.config.__class__.from_dict(model.config.to_dict())
    config._attn_implementation = attn
    if kv_heads is not None:
        config.num_key_value_heads = kv_heads
    twin = LlamaForCausalLM(config).eval()
    if kv_heads is None:
        twin.load_state_dict(model.state_dict())
    return twin


def test_switches_only_grouped_sdpa_models_on_cpu(tiny_model):
    grouped = _copy(tiny_model.model)
    assert use_grouped_sdpa(grouped)
    assert grouped.config._attn_implementation == IMPLEMENTATION
    check_tree_support(grouped)
    assert not use_grouped_sdpa(grouped)  # already switched
    restore_sdpa(grouped)
    assert grouped.config._attn_implementation == "sdpa"
    assert not use_grouped_sdpa(_copy(tiny_model.model, attn="eager"))
    # no key-value groups: switched only for the row-exact kernel
    exact = _native.load("attend") is not None and _native.load("attend").available()
    assert use_grouped_sdpa(_copy(tiny_model.model, kv_heads=4)) == exact


@pytest.mark.parametrize("seed", range(4))
def test_tree_passes_match_transformers_sdpa(tiny_model, seed):
    """Every pass shape (prompt, prompt + tree, tree, single row) gives the same logits as
    transformers' own sdpa attention on the same weights."""
    from transformers import DynamicCache

    ref_model = tiny_model.model
    grouped = _copy(ref_model)
    assert use_grouped_sdpa(grouped)
    rng = random.Random(seed)
    vocab = ref_model.config.vocab_size
    cached = [rng.randrange(100, vocab) for _ in range(rng.randrange(1, 20))]
    prefix = [rng.randrange(100, vocab) for _ in range(rng.randrange(0, 6))]
    trees = [random_tree(rng, n, vocab) for n in (1, rng.randrange(2, 17), 1)]
    results = []
    for model in (ref_model, grouped):
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.tensor([cached]), **cache_kwargs(model, cache), use_cache=True)
            out = [verify_tree(model, cache, tree, len(cached), prefix) for tree in trees[:1]]
            rollback(cache, len(cached))
            out += [verify_tree(model, cache, tree, len(cached), prefix) for tree in trees[1:2]]
            rollback(cache, len(cached))
            out += [verify_tree(model, cache, tree, len(cached)) for tree in trees[2:]]
        results.append(out)
    for ref, got in zip(*results, strict=True):
        assert torch.allclose(ref, got, atol=1e-5), (ref - got).abs().max()


@pytest.mark.parametrize("prompt", ["The weather in Paris", "hello hello hello", "{"])
def test_speculation_on_grouped_attention_is_lossless(tiny_model, prompt):
    model = _copy(tiny_model.model)
    assert use_grouped_sdpa(model)
    tok = tiny_model.tokenizer
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=tiny_model.eos_token_ids)
    constraint = free_text(vocab)
    ids = tok.encode(prompt, add_special_tokens=False)
    plain = run_decode(decode, model, vocab, ids, constraint, max_new_tokens=24,
                       sampling=SamplingParams())
    spec = run_decode(speculative_decode, model, vocab, ids, constraint, max_new_tokens=24,
                      sampling=SamplingParams(), config=SpecConfig(max_nodes=12),
                      tokenizer=tok)
    reference = run_decode(decode, tiny_model.model, vocab, ids, constraint, max_new_tokens=24,
                           sampling=SamplingParams())
    assert spec[0] == plain[0] == reference[0]


def test_tiny_llama_has_key_value_groups(smollm_tokenizer):
    """The switch is exercised only if the test model has grouped-query attention."""
    model = tiny_llama(smollm_tokenizer)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
