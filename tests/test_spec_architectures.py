"""Speculative decoding on other model families: lossless where the model honours a tree
pass, refused with a typed error where it does not (deliverable 2 of issue 4: "works with
any HF causal LM that accepts 4D masks; refuses others with a clear error").

Tiny randomly initialised models of each family, with the default model's tokenizer: what
is checked is the plumbing (masks, position ids, cache compaction), not quality.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import run_decode, tiny_llama

import structspec
from structspec.engine import decode, free_text
from structspec.hf_compat import cache_kwargs
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, UnsupportedModelError, speculative_decode
from structspec.spec.verify import probe_tree_support

transformers = pytest.importorskip("transformers")

SMALL = dict(num_hidden_layers=2, num_attention_heads=4)
# The usual grouped-query sizes, and with an explicit head size.
GQA = dict(hidden_size=32, intermediate_size=64, num_key_value_heads=2, **SMALL)
GQA_HEAD8 = dict(GQA, head_dim=8)
# family: (config class, model class, sizes). Each family builds its attention, positions
# and cache handling its own way (rotary, learned absolute positions, partial rotary,
# parallel blocks, q/k norms).
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", GQA),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(hidden_size=32, intermediate_size=64, **SMALL)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(GQA, pad_token_id=0)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(hidden_size=32, ffn_dim=64, word_embed_proj_dim=32, **SMALL)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, **SMALL)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", GQA_HEAD8),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", GQA_HEAD8),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", GQA),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", GQA),
}
# Families whose tests set more (a sliding window) or expect a refusal (BLOOM).
OTHERS = {
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=2, n_head=4)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", GQA_HEAD8),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GQA_HEAD8),
    "mistral": ("MistralConfig", "MistralForCausalLM", GQA),
}

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                   "n": {"enum": [1, 22, 333]}},
    "required": ["name", "ok", "n"],
}
PROMPT = 'Give me {"name": "Bob", "ok": true} and again {"name": "Bob", "ok": true}'


def family_model(name: str, tokenizer, **extra):
    """A tiny random model (seed 0) of family ``name`` (in ``FAMILIES`` or ``OTHERS``) for
    ``tokenizer``; ``extra`` goes to its config."""
    config_cls, model_cls, sizes = {**FAMILIES, **OTHERS}[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, bos_token_id=1,
        **sizes, **extra)
    return getattr(transformers, model_cls)(config).eval()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_speculative_greedy_equals_plain_greedy(family, smollm_tokenizer, smollm_vocab):
    model = family_model(family, smollm_tokenizer)
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False)
    schema = structspec.compile_json_schema(SCHEMA, smollm_vocab)
    for constraint in (schema, free_text(smollm_vocab)):
        plain = run_decode(decode, model, smollm_vocab, prompt, constraint, max_new_tokens=32,
                           sampling=SamplingParams())
        spec = run_decode(speculative_decode, model, smollm_vocab, prompt, constraint,
                          max_new_tokens=32, sampling=SamplingParams(),
                          tokenizer=smollm_tokenizer, config=SpecConfig())
        assert spec[:3] == plain[:3], family
        if constraint is schema and spec[3] is not None:  # forced text rode along in trees
            assert spec[3].stats.accepted_tokens > 0


def test_alibi_model_is_refused_with_the_models_error(smollm_tokenizer, smollm_vocab):
    # BLOOM builds its ALiBi biases from a 2D mask: a 4D tree mask makes it raise.
    model = family_model("bloom", smollm_tokenizer)
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False)
    for _ in range(2):  # the second refusal comes from the probe's memo
        with pytest.raises(UnsupportedModelError, match="BloomForCausalLM failed a tree pass"):
            speculative_decode(model, smollm_vocab, prompt, free_text(smollm_vocab),
                               max_new_tokens=4, sampling=SamplingParams(),
                               tokenizer=smollm_tokenizer)
    # Plain decoding still works on it.
    assert decode(model, smollm_vocab, prompt, free_text(smollm_vocab), max_new_tokens=4,
                  sampling=SamplingParams()).token_ids


class _Dropping(torch.nn.Module):
    """A causal LM that drops some of its forward's keywords (a model that ignores them)."""

    def __init__(self, model, drop: tuple[str, ...]) -> None:
        super().__init__()
        self.inner, self.drop, self.config = model, drop, model.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    @property
    def device(self):
        return self.inner.device

    @property
    def dtype(self):
        return self.inner.dtype

    def forward(self, **kwargs):
        for key in self.drop:
            kwargs.pop(key, None)
        return self.inner(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_that_ignores_the_tree_mask_is_refused(smollm_tokenizer, dtype):
    model = tiny_llama(smollm_tokenizer).to(dtype)
    probe_tree_support(_Dropping(model, ()))  # passing everything through: accepted
    with pytest.raises(UnsupportedModelError, match="differ from the same path run causally"):
        probe_tree_support(_Dropping(model, ("attention_mask",)))


def test_generator_falls_back_to_plain_decoding_and_says_so(smollm_tokenizer):
    from structspec.api import Generator
    from structspec.models import LoadedModel

    model = family_model("bloom", smollm_tokenizer)
    gen = Generator(LoadedModel(model, smollm_tokenizer, "tiny-bloom",
                                frozenset({smollm_tokenizer.eos_token_id})), pack=False)
    with pytest.warns(RuntimeWarning, match="Decoding without speculation"):
        first = gen.run("Say something.", regex="[a-z]{1,6}", chat=False, max_new_tokens=8)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "speculative decoding")  # once per Generator
        again = gen.run("Say something.", regex="[a-z]{1,6}", chat=False, max_new_tokens=8)
    plain = gen.run("Say something.", regex="[a-z]{1,6}", chat=False, max_new_tokens=8,
                    speculative=False)
    assert first.text == again.text == plain.text


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "mistral"])
def test_sliding_window_models_speculate_while_the_request_fits(family, smollm_tokenizer,
                                                              smollm_vocab):
    model = family_model(family, smollm_tokenizer, sliding_window=128)
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False)
    schema = structspec.compile_json_schema(SCHEMA, smollm_vocab)
    plain = run_decode(decode, model, smollm_vocab, prompt, schema, max_new_tokens=24,
                       sampling=SamplingParams())
    spec = run_decode(speculative_decode, model, smollm_vocab, prompt, schema,
                      max_new_tokens=24, sampling=SamplingParams(), tokenizer=smollm_tokenizer,
                      config=SpecConfig(max_nodes=8, draft_length=8))
    assert spec[:3] == plain[:3]
    # A request that could outgrow the window is refused, naming the window.
    with pytest.raises(UnsupportedModelError, match="window 128 tokens"):
        speculative_decode(model, smollm_vocab, prompt, schema, max_new_tokens=200,
                           sampling=SamplingParams(), tokenizer=smollm_tokenizer)


def test_prefix_cache_skips_layers_whose_window_dropped_keys(smollm_tokenizer):
    from transformers import DynamicCache

    from structspec.spec.prefix import PrefixCache

    model = family_model("mistral", smollm_tokenizer, sliding_window=16)
    prefixes = PrefixCache()
    # Two prompts sharing their first 10 tokens, each longer than the window: a sliding
    # layer then holds the last 15 tokens, not the shared 10.
    for start in (200, 300):
        prompt = list(range(100, 110)) + list(range(start, start + 20))
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]), **cache_kwargs(model, cache), use_cache=True)
        prefixes.learn(prompt, cache)
    assert len(prefixes) == 0


@pytest.mark.parametrize("family", ["gpt2", "falcon", "qwen2"])
def test_generator_packs_and_speculates_other_families(family, smollm_tokenizer):
    """A ``Generator`` packs the model's linears and switches its attention to structspec's
    kernel (``pack=True``): on these families too, the outputs are those of the unpacked
    model, with speculation and without."""
    import copy

    from structspec.api import Generator
    from structspec.models import LoadedModel

    model = family_model(family, smollm_tokenizer)
    outputs = []
    for pack in (False, True):
        loaded = LoadedModel(copy.deepcopy(model), smollm_tokenizer, family,
                             frozenset({smollm_tokenizer.eos_token_id}))
        gen = Generator(loaded, pack=pack)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "speculative decoding")  # no fallback
            for speculative in (False, True):
                result = gen.run("Make an object.", schema=SCHEMA, max_new_tokens=40,
                                 speculative=speculative)
                outputs.append(result.token_ids)
    assert all(ids == outputs[0] for ids in outputs)


def test_rescaled_rotary_positions_bound_the_request(smollm_tokenizer, smollm_vocab):
    """Dynamic rotary scaling picks its frequencies from a pass's longest position past the
    pretraining length: within it speculation is exact, beyond it refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from structspec.spec.verify import position_bound

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm_tokenizer), hidden_size=32, intermediate_size=64,
                         num_key_value_heads=2, max_position_embeddings=120,
                         rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                         eos_token_id=smollm_tokenizer.eos_token_id, bos_token_id=1, **SMALL)
    model = LlamaForCausalLM(config).eval()
    assert position_bound(model) == (120, "dynamic")
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False)
    schema = structspec.compile_json_schema(SCHEMA, smollm_vocab)
    short = SpecConfig(max_nodes=8, num_speculations=4, draft_length=8)
    plain = run_decode(decode, model, smollm_vocab, prompt, schema, max_new_tokens=24,
                       sampling=SamplingParams())
    spec = run_decode(speculative_decode, model, smollm_vocab, prompt, schema,
                      max_new_tokens=24, sampling=SamplingParams(), tokenizer=smollm_tokenizer,
                      config=short)
    assert spec[:3] == plain[:3]
    with pytest.raises(UnsupportedModelError, match="beyond 120 tokens"):
        speculative_decode(model, smollm_vocab, prompt, schema, max_new_tokens=100,
                           sampling=SamplingParams(), tokenizer=smollm_tokenizer, config=short)


@pytest.mark.parametrize(("params", "bound"), [
    ({"rope_type": "default", "rope_theta": 1e4}, None),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, None),
    ({"rope_type": "longrope", "original_max_position_embeddings": 4096}, (4096, "longrope")),
    ({"full_attention": {"rope_type": "dynamic"}, "sliding_attention": {"rope_type": "default"}},
     (300, "dynamic"))])
def test_position_bound_reads_the_rope_parameters(params, bound):
    from types import SimpleNamespace

    from structspec.spec.verify import check_positions, position_bound

    model = SimpleNamespace(config=SimpleNamespace(rope_parameters=params,
                                                   max_position_embeddings=300))
    assert position_bound(model) == bound
    if bound is None:
        check_positions(model, 10, 10**6)
        return
    limit, kind = bound
    check_positions(model, 10, limit)  # within the pretraining length: exact
    with pytest.raises(UnsupportedModelError, match=f"beyond {limit} tokens"):
        check_positions(model, 10, limit + 1)  # crossing it
    if kind == "longrope":  # wholly beyond it: the long frequencies throughout
        check_positions(model, limit + 1, 10**6)
    else:  # dynamic scaling rescales at every longer pass
        with pytest.raises(UnsupportedModelError):
            check_positions(model, limit + 1, 10**6)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}])
def test_static_rotary_scalings_speculate_exactly(rope, smollm_tokenizer, smollm_vocab):
    """Scalings fixed at load time (linear, Llama 3, YaRN) encode a position the same in any
    pass, past their original length too: no bound, identical outputs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from structspec.spec.verify import position_bound

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm_tokenizer), hidden_size=32, intermediate_size=64,
                         num_key_value_heads=2, max_position_embeddings=256, rope_scaling=rope,
                         eos_token_id=smollm_tokenizer.eos_token_id, bos_token_id=1, **SMALL)
    model = LlamaForCausalLM(config).eval()
    assert position_bound(model) is None
    prompt = smollm_tokenizer.encode(PROMPT * 2, add_special_tokens=False)  # past 64 tokens
    schema = structspec.compile_json_schema(SCHEMA, smollm_vocab)
    plain = run_decode(decode, model, smollm_vocab, prompt, schema, max_new_tokens=32,
                       sampling=SamplingParams())
    spec = run_decode(speculative_decode, model, smollm_vocab, prompt, schema,
                      max_new_tokens=32, sampling=SamplingParams(), tokenizer=smollm_tokenizer)
    assert spec[:3] == plain[:3]


def test_a_sliding_window_draft_model_drafts_past_its_window(smollm_tokenizer, smollm_vocab):
    """A draft model's cache has full layers: a sliding-window draft model (Gemma 3 drafting
    for a bigger Gemma 3) keeps drafting past its window, and only the target's own window
    bounds the request."""
    from structspec.spec.draft_model import DraftModel

    target = family_model("gemma3", smollm_tokenizer, sliding_window=512)
    draft = family_model("gemma3", smollm_tokenizer, sliding_window=8)
    prompt = smollm_tokenizer.encode(PROMPT, add_special_tokens=False)
    config = SpecConfig(draft_model=DraftModel(draft, smollm_tokenizer),
                        drafters=("draft_model",), max_nodes=8, draft_length=8)
    plain = run_decode(decode, target, smollm_vocab, prompt, free_text(smollm_vocab),
                       max_new_tokens=24, sampling=SamplingParams())
    out = run_decode(speculative_decode, target, smollm_vocab, prompt,
                     free_text(smollm_vocab), max_new_tokens=24, sampling=SamplingParams(),
                     tokenizer=smollm_tokenizer, config=config)
    assert out[:3] == plain[:3]
    assert out[3] is None or out[3].stats.draft_model_passes > 0
