"""The decode loop on a tiny random model with the real tokenizer: constraint respected,
KV-cached greedy equal to a from-scratch reference, limits, sampling reproducibility."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.errors import GenerationError
from structspec.masks import apply_mask, mask_to_bool
from structspec.sampling import (
    SamplingParams,
    TokenDraws,
    argmax,
    choose,
    make_draws,
    nucleus,
    probabilities,
    sample,
    sample_at,
)
from structspec.vocab import Vocabulary

PATTERN = r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)"\}'


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    prompt = tiny_model.tokenizer.encode("Give me a tagged id:", add_special_tokens=False)
    return tiny_model.model, vocab, prompt


@pytest.fixture(scope="module")
def constraint(tiny):
    return compile_regex(PATTERN, tiny[1])


def test_greedy_output_matches_the_regex(tiny, constraint):
    model, vocab, prompt = tiny
    out = decode(model, vocab, prompt, constraint, max_new_tokens=40, sampling=SamplingParams())
    text = vocab.decode_text(out.token_ids)
    assert out.complete
    assert re.fullmatch(PATTERN, text), text
    assert out.stats.new_tokens == len(out.token_ids)
    assert out.stats.forward_passes <= out.stats.new_tokens + 1


def test_cached_greedy_equals_uncached_reference(tiny, constraint):
    """The KV-cached loop picks exactly the tokens a from-scratch masked argmax picks."""
    model, vocab, prompt = tiny
    out = decode(model, vocab, prompt, constraint, max_new_tokens=40, sampling=SamplingParams())
    state, seq = constraint.initial, list(prompt)
    with torch.inference_mode():
        for token in out.token_ids:
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            allowed = mask_to_bool(constraint.allowed(state), logits.shape[-1])
            assert int(torch.argmax(apply_mask(logits, allowed))) == token
            state = constraint.advance(state, token)
            seq.append(token)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_is_valid_and_reproducible(tiny, constraint, seed):
    model, vocab, prompt = tiny
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=seed)
    a = decode(model, vocab, prompt, constraint, max_new_tokens=40, sampling=params)
    b = decode(model, vocab, prompt, constraint, max_new_tokens=40, sampling=params)
    assert a.token_ids == b.token_ids
    assert re.fullmatch(PATTERN, vocab.decode_text(a.token_ids))


def test_token_limit_raises_with_partial_text(tiny, constraint):
    model, vocab, prompt = tiny
    with pytest.raises(GenerationError) as info:
        decode(model, vocab, prompt, constraint, max_new_tokens=2, sampling=SamplingParams())
    assert len(info.value.token_ids) == 2
    assert info.value.text == vocab.decode_text(info.value.token_ids)
    assert "max_new_tokens=2" in str(info.value)


def test_an_output_accepted_at_the_limit_is_complete(tiny):
    model, vocab, prompt = tiny
    digits = compile_regex(r"[0-9]+", vocab)
    out = decode(model, vocab, prompt, digits, max_new_tokens=3, sampling=SamplingParams())
    assert out.complete and re.fullmatch(r"[0-9]+", vocab.decode_text(out.token_ids))


def test_free_text_never_emits_special_tokens(tiny):
    model, vocab, prompt = tiny
    params = SamplingParams(temperature=1.5, seed=3)
    try:
        out = decode(model, vocab, prompt, free_text(vocab), max_new_tokens=20, sampling=params)
        ids = out.token_ids
    except GenerationError as exc:  # free text accepts anywhere, so this cannot happen
        pytest.fail(str(exc))
    assert not set(ids) & vocab.special_token_ids


def test_bad_decode_arguments(tiny, constraint):
    model, vocab, prompt = tiny
    with pytest.raises(ValueError, match="prompt_ids"):
        decode(model, vocab, [], constraint, max_new_tokens=5, sampling=SamplingParams())
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode(model, vocab, prompt, constraint, max_new_tokens=0, sampling=SamplingParams())


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"temperature": -1}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0}, "top_p"),
     ({"top_p": 1.5}, "top_p"), ({"seed": "7"}, "seed"), ({"seed": 1.5}, "seed"),
     ({"seed": True}, "seed")],
)
def test_bad_sampling_parameters_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def _nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The rule over the whole distribution, sorted (ties in id order)."""
    values, order = torch.sort(probs, descending=True, stable=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[order[torch.cumsum(values, dim=-1) - values < top_p]] = True
    return keep


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 400), spikes=st.lists(st.tuples(st.integers(0, 399),
                                                            st.integers(0, 40)), max_size=12),
       base=st.sampled_from([0, 1, 3]), masked=st.integers(0, 399),
       temperature=st.sampled_from([0.3, 0.7, 1.0, 2.0]),
       top_p=st.sampled_from([0.01, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999]), seed=st.integers(0, 9))
def test_nucleus_keeps_what_a_full_sort_keeps(size, spikes, base, masked, temperature, top_p,
                                              seed):
    """Peaked and flat distributions, ties (integer logits), masked ids: the nucleus found
    among the likely ids only is the one the whole sorted distribution gives."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-base, base + 1, (size,), generator=gen).float()
    for at, height in spikes:
        logits[at % size] += height / 4
    logits[torch.arange(size) % 7 == masked % 7] = float("-inf")
    if torch.isinf(logits).all():
        logits[0] = 0.0
    probs = torch.softmax(logits / temperature, dim=-1)
    keep = nucleus(probs, top_p)
    assert torch.equal(keep, _nucleus_by_full_sort(probs, top_p))
    assert keep[torch.argmax(probs)] and float(probs[keep].sum()) >= min(top_p, 1.0) - 1e-5
    dropped_best = probs[~keep].max() if (~keep).any() else torch.tensor(0.0)
    assert float(dropped_best) <= float(probs[keep].min())  # a prefix of the sorted order


def test_nucleus_of_the_default_vocabulary_size_both_ways():
    """A 49k-id distribution, peaked (few candidates) and flat (all sorted)."""
    gen = torch.Generator().manual_seed(0)
    for scale in (8.0, 3.0, 0.2):
        probs = torch.softmax(torch.randn(49152, generator=gen) * scale, dim=-1)
        for top_p in (0.5, 0.9, 0.95):
            assert torch.equal(nucleus(probs, top_p), _nucleus_by_full_sort(probs, top_p))


def test_sample_draws_with_the_given_probabilities_and_never_a_zero():
    """Inverse-CDF draws: unnormalized weights, zeros inside and at both ends."""
    probs = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.5, 0.0, 0.5, 0.0])  # total 4
    gen = torch.Generator().manual_seed(11)
    n = 20000
    counts = torch.zeros(8)
    for _ in range(n):
        counts[sample(probs, gen)] += 1
    assert counts[probs == 0].sum() == 0
    expected = (probs / probs.sum() * n)[probs > 0]
    chi2 = float((((counts[probs > 0] - expected) ** 2) / expected).sum())
    assert chi2 < 25.0, (chi2, counts)  # 3 degrees of freedom: P(X > 25) < 2e-5
    assert sample(torch.tensor([0.0, 0.0, 3.0]), gen) == 2


def test_top_k_and_top_p_filter_and_keep_the_best():
    logits = torch.tensor([3.0, 2.0, 1.0, float("-inf"), 0.0])
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert p[2] == 0 and p[3] == 0 and p[4] == 0 and torch.isclose(p.sum(), torch.tensor(1.0))
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.01))
    assert p[0] == 1.0


_SPECIAL = st.sampled_from([float("-inf"), float("inf"), float("nan"), 0.0, -0.0, 1.0, -1.0])


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(_SPECIAL, st.floats(-1e6, 1e6, width=32),
                                 st.integers(-3, 3).map(float)), min_size=1, max_size=80),
       dtype=st.sampled_from([torch.float32, torch.float64]), stride=st.integers(1, 3))
def test_argmax_is_torch_argmax(values, dtype, stride):
    """The numpy-backed argmax gives torch's index on any row: ties (the first maximum),
    infinities, NaN (the first NaN), signed zeros, strided views."""
    row = torch.tensor(values, dtype=dtype).repeat_interleave(stride)[::stride]
    assert argmax(row) == int(torch.argmax(row))


def test_argmax_of_rows_numpy_cannot_take_goes_to_torch():
    row = torch.tensor([0.5, 2.0, 2.0, -1.0], dtype=torch.bfloat16)
    assert argmax(row) == 1
    grad = torch.tensor([0.0, 3.0, 1.0], requires_grad=True)
    assert argmax(grad) == 1


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(_SPECIAL, st.floats(-1e6, 1e6, width=32)), min_size=1,
                       max_size=60), data=st.data())
def test_apply_mask_sets_exactly_the_disallowed_ids_to_minus_infinity(values, data):
    logits = torch.tensor(values, dtype=torch.float32)
    allowed = torch.tensor(data.draw(st.lists(st.booleans(), min_size=len(values),
                                              max_size=len(values))))
    out = apply_mask(logits, allowed)
    expected = logits.masked_fill(~allowed, float("-inf"))
    assert out.dtype == logits.dtype
    assert torch.equal(out.isnan(), expected.isnan())
    assert torch.equal(out.nan_to_num(0.0), expected.nan_to_num(0.0))
    assert out.data_ptr() != logits.data_ptr()  # a new tensor; the logits are kept


def test_token_draws_are_fixed_by_seed_and_position_and_uniform():
    draws = TokenDraws(7)
    values = [draws(i) for i in range(20000)]
    assert values == [TokenDraws(7)(i) for i in range(20000)]  # a function of (seed, position)
    assert all(0.0 <= u < 1.0 for u in values)
    assert [TokenDraws(8)(i) for i in range(50)] != values[:50]
    assert TokenDraws(-1)(0) == TokenDraws(2**64 - 1)(0)  # seeds taken modulo 2**64
    assert TokenDraws(np.int64(7))(3) == draws(3)  # a NumPy integer is the same seed
    counts = [0] * 20
    for u in values:
        counts[int(u * 20)] += 1
    chi2 = sum((c - 1000) ** 2 / 1000 for c in counts)
    assert chi2 < 50, counts  # 19 degrees of freedom: P(X > 50) ≈ 1e-4
    # neighbouring positions and seeds are not correlated
    pairs = sum((a - 0.5) * (b - 0.5) for a, b in itertools.pairwise(values))
    assert abs(pairs / len(values)) < 0.005
    seeds = [TokenDraws(s)(0) for s in range(5000)]
    assert abs(sum(seeds) / len(seeds) - 0.5) < 0.02
    assert TokenDraws(None)(0) != TokenDraws(None)(0)  # unseeded: a fresh key each time
    torch.manual_seed(5)
    first = TokenDraws(None)(0)
    torch.manual_seed(5)
    assert TokenDraws(None)(0) == first  # ... from torch's global generator
    assert make_draws(SamplingParams()) is None
    assert make_draws(SamplingParams(temperature=1.0, seed=3))(5) == TokenDraws(3)(5)


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.sampled_from([0.0, 0.0, 1e-9, 0.25, 1.0, 3.0]), min_size=1,
                        max_size=12).filter(lambda w: sum(w) > 0),
       u=st.floats(0.0, 1.0, exclude_max=True))
def test_sample_at_picks_the_id_whose_cumulative_interval_holds_u(weights, u):
    """Inverse CDF: the id ``i`` with ``S(i-1) <= u * total < S(i)`` (float64 running sums in
    id order), never an id of weight 0, and monotone in ``u``."""
    probs = torch.tensor(weights, dtype=torch.float32)
    i = sample_at(probs, u)
    assert weights[i] > 0
    cumulative = torch.cumsum(probs, 0, dtype=torch.float64).tolist()
    target = cumulative[-1] * u
    below = cumulative[i - 1] if i else 0.0
    assert below <= target < cumulative[i] or i == max(j for j, w in enumerate(weights) if w)
    assert sample_at(probs, u + (1.0 - u) / 2) >= i


def test_sampling_without_the_positions_number_is_refused():
    with pytest.raises(ValueError, match="uniform number"):
        choose(torch.tensor([0.0, 1.0]), SamplingParams(temperature=1.0), None)
    assert choose(torch.tensor([0.0, 1.0]), SamplingParams(), None) == 1  # greedy needs none
