"""Exactly block-quantized weights (``structspec.spec.block_quant``) and the panel kernel's
quantized panels: recovery gives back every bit or nothing (the NumPy and C twins agree),
and a pass that reads the quantized panels gives bit for bit what the float32 panels give,
so plain and speculative decoding are unchanged by them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_decode, tiny_llama, torch_threads
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structspec import _native
from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.block_quant import BLOCK, BlockQuant, dequantize, recover
from structspec.spec.fastlinear import (
    PackedLinear,
    available_kernels,
    avx512,
    pack_linears,
    quant_max_rows,
    quantized_count,
    unpack_linears,
    use_avx512,
)
from structspec.vocab import Vocabulary

GEMM = _native.load("smallgemm")
native_q = pytest.mark.skipif(
    "panel" not in available_kernels() or not GEMM.available(True),
    reason="panel kernel not built here or the CPU lacks AVX2/FMA/F16C")


def _quantized(n: int, k: int, seed: int, kinds: str = "4") -> np.ndarray:
    """A float32 weight dequantized the way GGUF does it (``d * q + m`` in float32, d and m
    halves): Q4_1 blocks ("4"), Q8_0 blocks ("8"), or both mixed ("48"). As GGUF's quantizer
    chooses them, each Q4_1 block spans q = 0..15 and each Q8_0 block reaches |q| = 127."""
    rng = np.random.default_rng(seed)
    nb = k // BLOCK
    q4 = rng.integers(0, 16, (n, nb, BLOCK)).astype(np.float32)
    low = int(rng.integers(0, BLOCK))
    q4[..., low], q4[..., (low + 1 + int(rng.integers(0, BLOCK - 1))) % BLOCK] = 0, 15
    q8 = rng.integers(-127, 128, (n, nb, BLOCK)).astype(np.float32)
    q8[..., rng.integers(0, BLOCK)] = rng.choice([-127.0, 127.0])
    d4 = (rng.uniform(1e-3, 2e-2, (n, nb)).astype(np.float16)).astype(np.float32)
    d8 = (rng.uniform(1e-4, 2e-3, (n, nb)).astype(np.float16)).astype(np.float32)
    m4 = (rng.uniform(-0.2, 0.0, (n, nb)).astype(np.float16)).astype(np.float32)
    w4 = d4[..., None] * q4 + m4[..., None]
    w8 = d8[..., None] * q8
    pick = {"4": np.zeros((n, nb), bool), "8": np.ones((n, nb), bool),
            "48": rng.random((n, nb)) < 0.5}[kinds]
    return np.where(pick[..., None], w8, w4).reshape(n, k).astype(np.float32)


def _native_recover(w: np.ndarray) -> BlockQuant | None:
    n, k = w.shape
    q = np.empty((n, k), np.int8)
    d = np.empty((n, k // BLOCK), np.float32)
    m = np.empty_like(d)
    ok = GEMM.recover_q(w.ctypes.data, n, k, q.ctypes.data, d.ctypes.data, m.ctypes.data)
    return BlockQuant(q, d, m) if ok else None


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), blocks=st.integers(1, 6), seed=st.integers(0, 2**16),
       kinds=st.sampled_from(["4", "8", "48"]))
def test_recovery_gives_back_every_bit(n, blocks, seed, kinds):
    w = _quantized(n, blocks * BLOCK, seed, kinds)
    found = recover(w)
    assert found is not None
    assert np.array_equal(_bits(dequantize(found)), _bits(w))
    assert found.q.dtype == np.int8 and found.q.shape == w.shape
    assert np.array_equal(found.d.astype(np.float16).astype(np.float32), found.d)  # halves


@native_q
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), blocks=st.integers(1, 6), seed=st.integers(0, 2**16),
       kinds=st.sampled_from(["4", "8", "48"]), spoil=st.booleans())
def test_native_recovery_is_the_numpy_twin(n, blocks, seed, kinds, spoil):
    w = _quantized(n, blocks * BLOCK, seed, kinds)
    if spoil:  # one bit off in one weight: no quantization gives it back
        flat = w.view(np.uint32).reshape(-1)
        flat[seed % flat.size] ^= 1
    ours, theirs = recover(w), _native_recover(w)
    assert (ours is None) == (theirs is None) == spoil
    if ours is not None:
        for a, b in zip(ours, theirs, strict=True):
            assert np.array_equal(_bits(a), _bits(b))


@native_q
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("spoil_at", [None, 0, 17_000, -1])
def test_native_recovery_of_a_large_weight_over_threads(threads, spoil_at):
    """A weight of 19,200 blocks, enough for the recovery to split over threads: the numpy
    twin's numbers, and a single spoiled bit anywhere — the first block, one in a later
    thread's share, the last — refuses the whole weight."""
    w = _quantized(600, 1024, 5, "48")
    if spoil_at is not None:
        w.view(np.uint32).reshape(-1)[spoil_at * BLOCK + 3] ^= 1
    with torch_threads(threads):
        theirs = _native_recover(w)
    ours = recover(w)
    assert (ours is None) == (theirs is None) == (spoil_at is not None)
    if ours is not None:
        for a, b in zip(ours, theirs, strict=True):
            assert np.array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("weight", [
    np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32),  # a float32 model
    np.zeros((4, 48), np.float32),  # k not a multiple of 32
    np.full((2, 32), np.nan, np.float32),
    np.zeros((3, 32), np.float64),  # not float32
])
def test_recovery_refuses_what_it_cannot_give_back(weight):
    assert recover(weight) is None


def test_constant_and_zero_blocks_are_recovered_but_not_negative_zeros():
    w = np.concatenate([np.zeros((2, 32), np.float32), np.full((2, 32), -0.125, np.float32)],
                       axis=1)
    found = recover(w)
    assert found is not None and np.array_equal(_bits(dequantize(found)), _bits(w))
    w[1, 40] = -0.0  # no q, d, m widen to -0.0 (q's byte has no sign of zero)
    assert recover(w) is None


def _linear_from(w: np.ndarray, bias: bool, seed: int = 0) -> nn.Linear:
    n, k = w.shape
    lin = nn.Linear(k, n, bias=bias).eval()
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        if bias:
            lin.bias.copy_(torch.randn(n, generator=torch.Generator().manual_seed(seed)))
    return lin


@native_q
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k", "bias"), [(80, 64, True), (200, 96, False), (7, 32, True),
                                              (256, 160, True)])
def test_quantized_panels_give_the_float32_panels_bits(threads, n, k, bias, kernel_isa):
    """Every pass size 1-70 (the quantized panels up to quant_max_rows() rows; 1 row in
    groups of four panels and the panels left over), with the AVX2 and the AVX-512 kernels:
    the same bits as float32 panels alone, and each row the bits of a lone row."""
    last = quant_max_rows()
    lin = _linear_from(_quantized(n, k, seed=n + k, kinds="48"), bias, seed=k)
    quant, plain = PackedLinear(lin, "panel"), PackedLinear(lin, "panel", quantized=False)
    assert quant.quantized and not plain.quantized
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(5))
    with torch_threads(threads), torch.inference_mode():
        alone = torch.cat([quant(x[i:i + 1]) for i in range(70)])
        assert torch.equal(alone, torch.cat([plain(x[i:i + 1]) for i in range(70)]))
        for rows in [*range(1, last + 3), 13, 70]:
            assert torch.equal(quant(x[:rows]), alone[:rows]), rows
            assert torch.equal(plain(x[:rows]), alone[:rows]), rows


@native_q
def test_quantized_kernel_refuses_bad_shapes():
    with pytest.raises(ValueError, match="bad shape"):
        GEMM.linear(0, 1, 40, 0, 4, 0, 0, 1, 2)  # k not a multiple of 32
    with pytest.raises(ValueError, match="multiple of 32"):
        GEMM.pack_q(0, 0, 0, 0, 4, 40)
    with pytest.raises(ValueError, match="multiple of 32"):
        GEMM.recover_q(0, 4, 33, 0, 0, 0)
    with pytest.raises(ValueError, match="packed_bytes_q: .*multiple of 32"):
        GEMM.packed_bytes_q(4, 40)


@native_q
def test_only_exactly_quantized_layers_get_quantized_panels():
    model = nn.Sequential(_linear_from(_quantized(16, 64, 1), True),
                          nn.Linear(64, 16).eval(),  # float32 weights
                          nn.Linear(40, 8).eval())   # k not a multiple of 32
    pack_linears(model)
    assert [m.quantized for m in model] == [True, False, False]
    assert quantized_count(model) == 1
    assert "exact-quantized" in repr(model[0])
    import copy

    assert copy.deepcopy(model)[0].quantized
    unpack_linears(model)
    pack_linears(model, quantized=False)
    assert quantized_count(model) == 0


@pytest.fixture(scope="module")
def quantized_tiny(smollm_tokenizer):
    """The tiny random Llama with every linear (the tied output layer included) replaced by
    GGUF-style block-quantized numbers, and its float32 twin packed without them."""
    model = tiny_llama(smollm_tokenizer, seed=1)
    with torch.no_grad():
        for i, (name, mod) in enumerate(model.named_modules()):
            if isinstance(mod, nn.Linear):
                n, k = mod.weight.shape
                kinds = "8" if name == "lm_head" else "4"
                mod.weight.copy_(torch.from_numpy(_quantized(n, k, seed=i, kinds=kinds)))
    vocab = Vocabulary.from_tokenizer(smollm_tokenizer,
                                      eos_token_ids=frozenset({smollm_tokenizer.eos_token_id}))
    return model, vocab


@native_q
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("words", ["the weather in Paris", "hello hello {", "id is 42 and"])
def test_speculation_on_quantized_panels_equals_plain_decoding(quantized_tiny,
                                                               smollm_tokenizer, words):
    import copy

    model, vocab = quantized_tiny
    quant = pack_linears(copy.deepcopy(model))
    plain = pack_linears(copy.deepcopy(model), quantized=False)
    assert quantized_count(quant) == sum(isinstance(m, nn.Linear) for m in model.modules())
    assert quantized_count(plain) == 0
    prompt = smollm_tokenizer.encode(words, add_special_tokens=False)
    greedy = SamplingParams()
    runs = [run_decode(decode, m, vocab, prompt, free_text(vocab), max_new_tokens=24,
                       sampling=greedy) for m in (plain, quant)]
    runs.append(run_decode(speculative_decode, quant, vocab, prompt, free_text(vocab),
                           max_new_tokens=24, sampling=greedy, config=SpecConfig(max_nodes=8),
                           tokenizer=smollm_tokenizer))
    assert runs[0][:3] == runs[1][:3] == runs[2][:3]
    ids = torch.tensor([(prompt * 8)[:12]])
    with torch.inference_mode():
        for rows in (1, 3, quant_max_rows(), quant_max_rows() + 1):
            a, b = quant(ids[:, :rows]).logits, plain(ids[:, :rows]).logits
            assert torch.equal(a, b), rows


@native_q
def test_the_cost_curve_is_measured_either_side_of_the_quantized_passes(quantized_tiny):
    import copy

    from structspec.spec.cost import curve_sizes
    from structspec.spec.fastlinear import COST_STEPS, COST_STEPS_AVX512, cost_steps

    model = pack_linears(copy.deepcopy(quantized_tiny[0]))
    steps = cost_steps(model)
    last = quant_max_rows()
    table = COST_STEPS_AVX512 if avx512() else COST_STEPS
    assert set(steps) == {*table["panel"], (last, last)}
    assert {last, last + 1} <= set(curve_sizes(steps))


@native_q
@pytest.mark.skipif(not avx512(), reason="this CPU has no AVX-512F")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(576, 64), (200, 96), (7, 32), (48, 160)])
def test_avx512_kernels_give_the_avx2_kernels_bits(threads, n, k):
    """The AVX-512 kernels (float32 panels in blocks of up to 12 rows against two panels,
    quantized panels up to 8 rows against up to four) against the AVX2 ones, every pass
    size 1-40 and 70, with a bias and without, panel counts odd and even: the same bits."""
    lin = _linear_from(_quantized(n, k, seed=3 * n + k, kinds="48"), n % 2 == 0, seed=n)
    layers = {"quant": PackedLinear(lin, "panel"),
              "plain": PackedLinear(lin, "panel", quantized=False)}
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(n))
    got: dict[bool, dict[tuple[str, int], torch.Tensor]] = {}
    before = use_avx512(True)
    try:
        for wide in (False, True):
            use_avx512(wide)
            with torch_threads(threads), torch.inference_mode():
                got[wide] = {(name, rows): layer(x[:rows])
                             for name, layer in layers.items() for rows in [*range(1, 41), 70]}
    finally:
        use_avx512(before)
    for key, out in got[False].items():
        assert torch.equal(out, got[True][key]), key
