"""Trees sized by the device: where the cost curve carries many nodes for free (a GPU), the
``None`` node budgets widen to those nodes; a CPU's rising curve keeps the defaults;
explicit bounds are never changed; and the wide trees stay lossless (speculative greedy ==
plain greedy on the tiny random model, with and without a draft head)."""

from __future__ import annotations

import pytest
from conftest import (
    exact_pairs,
    fixed_drafter,
    random_draft_head,
    run_decode,
    sampled_pairs_chi_square,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.errors import GenerationError
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.config import AUTO_BUDGETS, WIDE_MAX_NODES
from structspec.spec.cost import CostCurve, free_nodes
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams()
#: A launch-bound GPU's curve: every size up to 64 nodes costs what one node does.
FLAT = CostCurve((1, 64), (0.018, 0.018))
#: A CPU's: each node adds ~4% of a one-node pass.
RISING = CostCurve((1, 2, 4, 8, 16, 32), (0.0225, 0.0231, 0.0243, 0.0262, 0.0318, 0.0425))
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "hello",
         "{", '"name"', ":", "blue", "tag", ","]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    vocab = Vocabulary.from_tokenizer(tiny_model.tokenizer, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {"tag": compile_regex(
        r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}', vocab),
        "free": free_text(vocab)}
    return (tiny_model.model, tiny_model.tokenizer, vocab, constraints,
            random_draft_head(tiny_model.model))


def test_the_curves_free_nodes():
    assert free_nodes(FLAT) == 63
    assert free_nodes(RISING) < min(nodes for nodes, _ in AUTO_BUDGETS.values())


@pytest.mark.parametrize("structured", [True, False])
def test_auto_budgets_widen_only_where_nodes_are_free(structured):
    kind = "structured" if structured else "free"
    nodes, branches = AUTO_BUDGETS[kind]
    cfg = SpecConfig()
    assert cfg.budgets(structured) == (nodes, branches)
    assert cfg.budgets(structured, free_nodes(RISING)) == (nodes, branches)
    assert cfg.budgets(structured, nodes) == (nodes, branches)
    assert cfg.budgets(structured, nodes + 3) == (nodes + 3, branches)
    assert cfg.budgets(structured, free_nodes(FLAT)) == (WIDE_MAX_NODES, branches)
    assert cfg.budgets(structured, 20) == (20, branches)
    # Explicit bounds stand, whatever the device.
    assert SpecConfig(max_nodes=8, num_speculations=2).budgets(structured, 63) == (8, 2)
    assert SpecConfig(max_nodes=8).budgets(structured, 63)[0] == 8


@pytest.mark.parametrize(("name", "curve", "wide"), [
    ("free", FLAT, True), ("tag", FLAT, True), ("free", RISING, False), ("tag", RISING, False)])
def test_decoding_reports_the_trees_it_sized(tiny, name, curve, wide):
    model, tok, vocab, constraints, head = tiny
    prompt = tok.encode("the id is 42 and the tag is red", add_special_tokens=False)
    try:
        stats = speculative_decode(model, vocab, prompt, constraints[name], max_new_tokens=12,
                                   sampling=GREEDY, tokenizer=tok,
                                   config=SpecConfig(draft_head=head, cost_curve=curve)).stats
    except GenerationError as exc:  # the token budget ran out: the error carries the stats
        stats = exc.stats
    assert stats.wide is wide
    assert (stats.as_dict()["wide"], stats.as_dict()["max_nodes"]) == (wide, stats.max_nodes)
    expected = WIDE_MAX_NODES if wide else AUTO_BUDGETS["free" if name == "free"
                                                        else "structured"][0]
    assert stats.max_nodes == expected
    assert max(stats.budgets, default=0) <= expected


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
       name=st.sampled_from(["tag", "free"]), max_new=st.integers(1, 40),
       head_on=st.booleans())
def test_wide_trees_are_lossless(tiny, words, name, max_new, head_on):
    model, tok, vocab, constraints, head = tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    plain = run_decode(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=GREEDY)
    cfg = SpecConfig(draft_head=head if head_on else False, cost_curve=FLAT, window=2)
    spec = run_decode(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                      sampling=GREEDY, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]
    if spec[3] is not None:
        assert spec[3].stats.wide and spec[3].stats.max_nodes == WIDE_MAX_NODES


def test_wide_sampled_trees_follow_the_target_distribution(tiny):
    """Sampling through a tree wider than the free-text default (3 first tokens × 3
    followers: 12 nodes, kept whole under a flat curve): two-token outputs under top-k=3
    match the exact probabilities (chi-square), so the seeded acceptance stays lossless
    with many siblings at both levels."""
    model, tok, vocab, constraints, _ = tiny
    c = constraints["free"]
    prompt = tok.encode("red green blue", add_special_tokens=False)
    exact = exact_pairs(model, prompt, c, SamplingParams(temperature=1.0, top_k=3))
    cfg = SpecConfig(drafters=(fixed_drafter(list(exact)),), forced=False, adaptive=False,
                     cost_curve=FLAT, draft_head=False)
    stat, counts, first = sampled_pairs_chi_square(model, vocab, tok, prompt, c, cfg, exact,
                                                   600)
    assert first.wide and first.planned[0] == len(exact) + 3  # the whole tree, first pass
    assert stat < 36.0, (stat, counts, exact)  # chi-square, 8 df: P(X > 36) ≈ 2e-5
