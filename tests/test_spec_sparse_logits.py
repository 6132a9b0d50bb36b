"""Logits only where the constraint leaves a choice: the gathered logits are bitwise the
whole rows' (every pass size, both kernel ISAs, quantized and float32 panels), and decoding
with them — plain and speculative, greedy and sampling — emits exactly what it emits
without them."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import decode_both
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from structspec.automata.base import TokenMask
from structspec.automata.regex import compile_regex
from structspec.engine import free_text
from structspec.sampling import SamplingParams
from structspec.spec import sparse_logits as sl
from structspec.spec.block_quant import dequantize, quantize_q4_1
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.fastlinear import PackedLinear, packing_available
from structspec.vocab import Vocabulary

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not packing_available(), reason="the panel kernel is not built here"),
]

PATTERNS = {
    "call": (r'\{"name":"(get_weather|get_time)","arguments":\{"city":"[A-Za-z ]{1,12}",'
             r'"days":[0-9]{1,2}(,"unit":"(celsius|fahrenheit)")?\}\}'),
    "tag": r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}',
    "digits": r"[0-9]{1,6}",
}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "{"]


def _layer(quantized: bool, bias: bool, n: int = 300, k: int = 64) -> PackedLinear:
    torch.manual_seed(1)
    linear = nn.Linear(k, n, bias=bias)
    if quantized:  # numbers dequantized from Q4_1, as the default model's body linears
        w = dequantize(quantize_q4_1(linear.weight.detach().numpy()))
        linear.weight.data = torch.from_numpy(np.ascontiguousarray(w))
    return PackedLinear(linear, "panel")


@pytest.mark.parametrize("quantized", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_gathered_logits_are_the_whole_rows_bits(kernel_isa, quantized, bias):
    layer = _layer(quantized, bias)
    assert layer.quantized == quantized
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for m in (1, 2, 3, 5, 8, 9, 12, 13, 20, 40):
            x = torch.randn(m, 64, generator=gen)
            full = layer(x)  # the pass's own kernel for m rows
            for n in (1, 7, 16, 33):
                ids = torch.randperm(300, generator=gen)[:n].sort().values
                assert torch.equal(sl.gathered_logits(layer, x, ids), full[:, ids]), (m, n)


def test_row_plan_gathers_small_sets_within_the_union_cap():
    size = 5000
    small = TokenMask.from_ids([3, 9], size)
    one = TokenMask.from_ids([7], size)
    big = TokenMask.from_ids(range(sl.MAX_GATHERED + 1), size)
    plan = sl.row_plan([big, small, one, small], sl.IdCache())
    assert plan.full == (0,)
    assert {r: v.tolist() for r, v in plan.gathered.items()} == {1: [3, 9], 2: [7], 3: [3, 9]}
    plan = sl.row_plan([None, one], sl.IdCache())  # an unknown set: the row goes whole
    assert plan.full == (0,) and list(plan.gathered) == [1]
    wide = [TokenMask.from_ids(range(i * 64, i * 64 + 64), size) for i in range(20)]
    plan = sl.row_plan(wide, sl.IdCache())  # 20 x 64 ids > MAX_UNION: the rest go whole
    assert len(plan.gathered) == sl.MAX_UNION // 64
    assert plan.full == tuple(range(sl.MAX_UNION // 64, 20))


def test_assembled_rows_mask_to_the_whole_rows():
    layer = _layer(True, False)
    masks = [TokenMask.from_ids([5, 17, 299], 300), TokenMask.from_ids(range(300), 300),
             TokenMask.from_ids([0], 300)]
    x = torch.randn(3, 64)
    with torch.inference_mode():
        full = layer(x)
        cache = sl.IdCache(limit=8)
        plan = sl.row_plan(masks, cache)
        assert plan.full == (1,)
        got = sl.assemble(plan, full[list(plan.full)], x, layer)
    for row, mask in enumerate(masks):
        allowed = torch.from_numpy(mask.to_bool().copy())
        want = full[row].masked_fill(~allowed, float("-inf"))
        assert torch.equal(got[row].masked_fill(~allowed, float("-inf")), want)


def test_ids_beyond_the_output_layer_are_refused():
    layer = _layer(False, False)
    plan = sl.row_plan([TokenMask.from_ids([3, 300], 400)], sl.IdCache())
    with torch.inference_mode(), pytest.raises(ValueError, match="beyond the logits width"):
        sl.assemble(plan, torch.empty(0, 300), torch.randn(1, 64), layer)


@pytest.fixture(scope="module")
def packed_tiny(tiny_model):
    model = copy.deepcopy(tiny_model.model)
    use_fast_cpu_paths(model)
    tok = tiny_model.tokenizer
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {k: compile_regex(v, vocab) for k, v in PATTERNS.items()}
    constraints["free"] = free_text(vocab)
    return model, tok, vocab, constraints


def test_supports(packed_tiny, tiny_model):
    model = packed_tiny[0]
    assert sl.supports(model)
    assert not sl.supports(tiny_model.model)  # an unpacked output layer
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 30.0
    assert not sl.supports(capped)


class _Spy:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = sl.assemble

        def spy(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(sl, "assemble", spy)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=8),
       name=st.sampled_from(sorted([*PATTERNS, "free"])),
       temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 3))
def test_decoding_with_sparse_logits_emits_the_same_tokens(packed_tiny, monkeypatch, words,
                                                          name, temperature, seed):
    model, tok, vocab, constraints = packed_tiny
    spy = _Spy(monkeypatch)
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    sampling = SamplingParams(temperature=temperature, top_k=5 if temperature else None,
                              seed=seed)
    c = constraints[name]
    for sparse in (True, False):
        plain, spec = decode_both(model, vocab, tok, prompt, c, sampling, sparse_logits=sparse)
        if sparse:
            want_plain, want_spec = plain[:3], spec[:3]
        else:
            assert plain[:3] == want_plain and spec[:3] == want_spec
            for run in (plain, spec):  # (the output of a run that ended without error)
                assert run[3] is None or run[3].stats.sparse_rows == 0
    if name != "free" and len(want_plain[0]) > 1:
        assert spy.calls > 0  # the gathered path ran
