"""The KV cache goes under the keyword the model's ``forward`` takes (transformers renamed it
in 5.24; an unknown keyword would be swallowed by ``**kwargs`` and the cache ignored)."""

from __future__ import annotations

import pytest

from structspec import hf_compat
from structspec.hf_compat import cache_kwargs


class _New:
    def forward(self, input_ids=None, cache=None, **kwargs):
        return None


class _Old:
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        return None


class _Wrapper:
    def forward(self, *args, **kwargs):
        return None


def test_the_keyword_the_forward_names():
    assert cache_kwargs(_New(), "c") == {"cache": "c"}
    assert cache_kwargs(_Old(), "c") == {"past_key_values": "c"}


@pytest.mark.parametrize(("version", "keyword"), [
    ("5.17.0", "past_key_values"), ("5.23.1", "past_key_values"), ("5.24.0", "cache"),
    ("5.25.0.dev0", "cache"), ("6.0.0rc1", "cache")])
def test_a_wrapper_gets_the_installed_releases_keyword(monkeypatch, version, keyword):
    import transformers

    monkeypatch.setattr(transformers, "__version__", version)
    hf_compat._default_keyword.cache_clear()
    hf_compat._keyword_of.cache_clear()
    try:
        assert cache_kwargs(_Wrapper(), "c") == {keyword: "c"}
    finally:
        hf_compat._default_keyword.cache_clear()
        hf_compat._keyword_of.cache_clear()


def test_the_real_models_take_the_cache_we_pass(tiny_model):
    """A tiny Llama: a step on the cache gives the logits of the whole sequence run at once
    (a swallowed keyword would run the step without its past)."""
    import torch
    from transformers import DynamicCache

    model = tiny_model.model
    ids = torch.tensor([[5, 17, 300, 42]])
    with torch.inference_mode():
        whole = model(input_ids=ids).logits[0, -1]
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :3], **cache_kwargs(model, cache), use_cache=True)
        step = model(input_ids=ids[:, 3:], **cache_kwargs(model, cache), use_cache=True)
    assert torch.allclose(step.logits[0, -1], whole, atol=1e-5)
