"""Prefix KV cache: the shared beginning of prompts is prefilled once; outputs unchanged in
plain and speculative decoding."""

from __future__ import annotations

import pytest
import torch

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.hf_compat import cache_kwargs
from structspec.sampling import SamplingParams
from structspec.spec import speculative_decode
from structspec.spec.prefix import PrefixCache, common_prefix
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")
GREEDY = SamplingParams()
HEADER = "<|im_start|>system\nYou are a precise assistant. Answer with JSON only.<|im_end|>\n"
REQUESTS = ["the id is 42 and the tag is red", "tag green, id 7", "blue 123 ok",
            "the id is 42 and the tag is red"]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    tag = compile_regex(r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}', vocab)
    return tiny_model.model, tiny_model.tokenizer, vocab, {"tag": tag, "free": free_text(vocab)}


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [5]) == 1


@pytest.mark.parametrize("name", ["tag", "free"])
@pytest.mark.parametrize("speculative", [False, True])
def test_outputs_are_unchanged_and_the_header_is_reused(tiny, name, speculative):
    model, tok, vocab, constraints = tiny
    prefixes = PrefixCache(min_tokens=8)
    header_len = len(tok.encode(HEADER, add_special_tokens=False))
    for request in REQUESTS:
        ids = tok.encode(HEADER + request, add_special_tokens=False)
        outputs = []
        for cache in (None, prefixes):
            kwargs = dict(max_new_tokens=24, sampling=GREEDY, prefix_cache=cache)
            if speculative:
                out = speculative_decode(model, vocab, ids, constraints[name], tokenizer=tok,
                                         **kwargs)
            else:
                out = decode(model, vocab, ids, constraints[name], **kwargs)
            outputs.append(out.token_ids)
        assert outputs[0] == outputs[1]
    # Learned from the first two (different) prompts; the repeated prompt is not stored whole.
    assert len(prefixes) == 1
    (key,) = prefixes._entries
    assert header_len <= len(key) < len(tok.encode(HEADER + REQUESTS[0], add_special_tokens=False))
    assert prefixes.hits == 2  # the third and fourth requests


def test_restore_fills_the_cache_exactly(tiny):
    from transformers import DynamicCache

    model, tok, _, _ = tiny
    a = tok.encode(HEADER + "first request", add_special_tokens=False)
    b = tok.encode(HEADER + "second one", add_special_tokens=False)
    prefixes = PrefixCache(min_tokens=4)
    with torch.inference_mode():
        for ids in (a, b):
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([ids]), **cache_kwargs(model, cache), use_cache=True)
            prefixes.learn(ids, cache)
        n = common_prefix(a, b)
        cache = DynamicCache(config=model.config)
        assert prefixes.restore(b, cache) == n
        assert cache.get_seq_length() == n
        full = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([b]), **cache_kwargs(model, full), use_cache=True)
        for got, want in zip(cache.layers, full.layers, strict=True):
            torch.testing.assert_close(got.keys, want.keys[..., :n, :], atol=1e-5, rtol=1e-4)
    assert prefixes.restore(b[:n], DynamicCache(config=model.config)) == 0  # needs a last token
    prefixes.clear()
    assert len(prefixes) == 0
