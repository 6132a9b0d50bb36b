"""A prompt's rows on coarser integer blocks (``structspec/_native/promptdot.c``,
:mod:`structspec.spec.prompt_rows`): the kernel computes the documented arithmetic, a row's
numbers depend on that row alone, a pass sends exactly its prompt rows there and the rest to
the shared kernels, and decoding with it — plain, speculative, from a prefix cache — emits
the same tokens."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import q4_llama, run_decode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.prefix import PrefixCache
from structspec.spec.prompt_rows import (
    kernel,
    prompt_panel_count,
    prompt_row_count,
    prompt_rows,
    use_prompt_panels,
)
from structspec.vocab import Vocabulary

PD = kernel()
pytestmark = pytest.mark.skipif(PD is None, reason="promptdot is not built here or the CPU "
                                                   "lacks AVX-512 VNNI")
BLOCK = 64


def _reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The documented arithmetic in NumPy (float64): x and w rounded to int8 per row / output
    and block of 64, integer sums scaled by both scales, summed over blocks, plus the bias."""
    k = x.shape[1]

    def rounded(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = a.reshape(a.shape[0], k // BLOCK, BLOCK).astype(np.float32)
        amax = np.abs(b).max(-1, keepdims=True)
        inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0)
        q = np.clip(np.rint(b * inv.astype(np.float32)), -127, 127).astype(np.int64)
        return q, np.where(amax > 0, amax / np.float32(127), 0).astype(np.float32)[..., 0]

    qa, sa = rounded(x)
    qw, sw = rounded(w)
    isum = np.einsum("mbi,nbi->mnb", qa, qw).astype(np.float64)
    out = (isum * sa[:, None, :].astype(np.float64) * sw[None].astype(np.float64)).sum(-1)
    return out if bias is None else out + bias.astype(np.float64)


def _run(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
         threads: int = 1) -> torch.Tensor:
    out = torch.empty(x.shape[0], n)
    PD.linear(x.data_ptr(), x.shape[0], x.shape[1], panels.data_ptr(), n,
              0 if bias is None else bias.data_ptr(), out.data_ptr(), threads)
    return out


def _panels(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    panels = torch.empty(PD.packed_bytes(n, k), dtype=torch.uint8)
    PD.pack(panels.data_ptr(), w.contiguous().data_ptr(), n, k)
    return panels


@pytest.mark.parametrize(("m", "n", "k", "bias"), [(1, 16, 64, True), (7, 40, 128, False),
                                                   (13, 200, 576, True), (30, 33, 192, True)])
def test_outputs_follow_the_documented_arithmetic(m, n, k, bias):
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :BLOCK] = 0.0  # a block of zeros: scale 0, nothing added
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    got = _run(torch.from_numpy(x), _panels(torch.from_numpy(w)), n,
               None if b is None else torch.from_numpy(b))
    want = _reference(x, w, b)
    scale = np.abs(want).max()
    assert np.abs(got.numpy() - want).max() <= 1e-5 * scale
    # and within the rounding's reach of the float product
    assert np.abs(got.numpy() - (x @ w.T + (0 if b is None else b))).max() <= 0.05 * scale


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), blocks=st.integers(1, 6), n=st.integers(1, 70),
       seed=st.integers(0, 2**16), threads=st.sampled_from([1, 2]))
def test_a_rows_numbers_depend_on_that_row_alone(rows, blocks, n, seed, threads):
    """Bitwise the same alone, in any pass, on one thread or two: what keeps plain and
    speculative decoding's prompts the same whatever the pass carries."""
    g = torch.Generator().manual_seed(seed)
    k = blocks * BLOCK
    x = torch.randn(rows, k, generator=g) * 3
    w = torch.randn(n, k, generator=g)
    bias = torch.randn(n, generator=g)
    panels = _panels(w)
    whole = _run(x, panels, n, bias, threads)
    i = seed % rows
    assert torch.equal(_run(x[i:i + 1].clone(), panels, n, bias), whole[i:i + 1])
    assert torch.equal(_run(x[i:].clone(), panels, n, bias), whole[i:])


@pytest.mark.parametrize(("n", "k"), [(16, 64), (33, 192), (200, 576), (7, 128)])
def test_vector_packing_gives_the_plain_loops_bytes(n, k):
    """Packing runs over every weight at load: with vectors (the default) ~5x faster for the
    default model, byte for byte the plain loop's — zero blocks, an infinity, ties included."""
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * 0.1
    w[0, :BLOCK] = 0.0
    w[-1, 3] = float("inf")
    w[n // 2, :BLOCK] = torch.arange(BLOCK, dtype=torch.float32) - 31.5  # x.5 after scaling
    a = torch.empty(PD.packed_bytes(n, k), dtype=torch.uint8)
    b = torch.empty_like(a)
    PD.pack(a.data_ptr(), w.data_ptr(), n, k)
    PD.pack(b.data_ptr(), w.data_ptr(), n, k, False)
    assert torch.equal(a, b)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 64"):
        PD.packed_bytes(16, 96)
    with pytest.raises(ValueError, match="multiple of 64"):
        PD.pack(0, 0, 16, 32)
    x = torch.zeros(1, 64)
    with pytest.raises(ValueError, match="m < 0"):
        PD.linear(x.data_ptr(), -1, 64, 0, 16, 0, x.data_ptr(), 1)
    assert PD.block() == BLOCK


def _q4_model(hidden: int = 64, seed: int = 0, prompt_panels: bool = True):
    """A tiny Llama with Q4_1 body weights and a Q8_0 output layer (as the default model),
    widths multiples of 64, packed with prompt panels (``prompt_panels``)."""
    return use_fast_cpu_paths(q4_llama(seed=seed, hidden=hidden), prompt_panels=prompt_panels)


@pytest.fixture(scope="module")
def q4_tiny(smollm_tokenizer):
    model = _q4_model()
    vocab = Vocabulary.from_tokenizer(smollm_tokenizer, eos_token_ids={2})
    return model, smollm_tokenizer, vocab


def test_body_layers_get_prompt_panels_and_the_output_layer_does_not(q4_tiny):
    model = q4_tiny[0]
    assert prompt_panel_count(model) == 14  # 2 layers x 7 linears
    assert model.get_output_embeddings().int8
    assert model.get_output_embeddings().prompt_panels is None
    assert use_prompt_panels(model) == 14  # idempotent
    copied = copy.deepcopy(model)
    assert prompt_panel_count(copied) == 14
    # off where asked: a draft model never prefills a prompt
    assert prompt_panel_count(_q4_model(seed=1, prompt_panels=False)) == 0


@pytest.mark.parametrize("prompt", [0, 3, 9, 40])
def test_a_pass_sends_its_prompt_rows_there_and_the_rest_to_the_shared_kernel(q4_tiny,
                                                                              prompt):
    layer = q4_tiny[0].model.layers[0].mlp.gate_proj
    x = torch.randn(1, 9, layer.in_features)
    with torch.inference_mode():
        plain = layer(x)
        with prompt_rows(prompt):
            mixed = layer(x)
        assert torch.equal(layer(x), plain)  # the block's count is gone after it
    p = min(prompt, 9)
    assert torch.equal(mixed[0, p:], plain[0, p:])  # tree rows: the shared kernel's bits
    want = _run(x[0, :p].contiguous(), layer.prompt_panels, layer.out_features, layer._bias)
    assert torch.equal(mixed[0, :p], want)
    if p:
        assert not torch.equal(mixed[0, :p], plain[0, :p])  # (another rounding)


def test_nested_blocks_restore_the_outer_count():
    from structspec.spec.prompt_rows import PROMPT_ROWS

    with prompt_rows(5):
        with prompt_rows(0):
            assert PROMPT_ROWS.get() == 0
        assert PROMPT_ROWS.get() == 5
    assert PROMPT_ROWS.get() == 0


def test_a_split_model_runs_its_prompt_rows_as_any_other(q4_tiny):
    model = copy.deepcopy(q4_tiny[0])
    assert prompt_row_count(model, 12) == 12 and prompt_row_count(model, -3) == 0
    model._structspec_shard = (0, 2)  # as shard_model marks it
    assert prompt_row_count(model, 12) == 0


PATTERNS = {"call": r'\{"city":"[A-Za-z ]{1,12}","days":[0-9]{1,2}\}', "digits": r"[0-9]{1,6}"}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "{"]


@pytest.mark.usefixtures("one_thread")
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
       name=st.sampled_from(["call", "digits", "free"]),
       temperature=st.sampled_from([0.0, 0.9]), seed=st.integers(0, 99))
def test_plain_speculative_and_prefix_cached_decoding_emit_the_same_tokens(
        q4_tiny, words, name, temperature, seed):
    """The prompt's rows go through prompt panels in every decoder — plain decoding's whole
    prefill, speculative decoding's first pass up to its tree, the tail after a prefix cache
    hit — and the tree's rows never do: the same tokens, greedy and sampled."""
    model, tok, vocab = q4_tiny
    c = free_text(vocab) if name == "free" else compile_regex(PATTERNS[name], vocab)
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    sampling = SamplingParams(temperature=temperature, seed=seed)
    plain = run_decode(decode, model, vocab, prompt, c, max_new_tokens=16, sampling=sampling)
    spec = run_decode(speculative_decode, model, vocab, prompt, c, max_new_tokens=16,
                      sampling=sampling, tokenizer=tok, config=SpecConfig())
    assert plain[:3] == spec[:3]
    # A prefix cache that holds the prompt (two requests that share it teach it), then a
    # longer request: its prefill is the tail alone, its rows still prompt rows.
    cache = PrefixCache(min_tokens=1)
    for tail in (" red", " 42"):
        run_decode(decode, model, vocab, [*prompt, *tok.encode(tail, add_special_tokens=False)],
                   c, max_new_tokens=1, sampling=sampling, prefix_cache=cache)
    longer = [*prompt, *tok.encode(" the id", add_special_tokens=False)]
    cold = run_decode(decode, model, vocab, longer, c, max_new_tokens=16, sampling=sampling)
    warm_plain = run_decode(decode, model, vocab, longer, c, max_new_tokens=16,
                            sampling=sampling, prefix_cache=cache)
    warm_spec = run_decode(speculative_decode, model, vocab, longer, c, max_new_tokens=16,
                           sampling=sampling, tokenizer=tok, config=SpecConfig(),
                           prefix_cache=cache)
    assert cache.hits == 2 and cache.reused_tokens == 2 * len(prompt)
    assert cold[:3] == warm_plain[:3] == warm_spec[:3]
